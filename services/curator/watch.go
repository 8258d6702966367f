package curator

import "context"

// watchHub fans one etcd watch out to every Watch stream (to be written).
type watchHub struct{ s *Service }

func newWatchHub(s *Service) *watchHub { return &watchHub{s: s} }

func (h *watchHub) run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}
