package curator

import curatorv1 "curia.dev/gen/curia/curator/v1"

// leasesServer implements curia.curator.v1.Leases (to be written).
type leasesServer struct {
	curatorv1.UnimplementedLeasesServer
	s *Service
}
