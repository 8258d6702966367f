package local

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestAwaitLoss: curia-local recover goes on only when no quorum is seen
// for the settle window on end, measured from when each look began, and
// refuses a quorum still seen after twice the window. Each look is
// scripted: what it sees and how long it takes (a look that waits for a
// curator that cannot read etcd takes its 3 s timeout).
func TestAwaitLoss(t *testing.T) {
	const settle = 3 * time.Second
	type look struct {
		seen string
		took time.Duration
	}
	leader := func(n int) []look {
		out := make([]look, n)
		for i := range out {
			out[i].seen = "leader"
		}
		return out
	}
	quiet := func(n int, took time.Duration) []look {
		out := make([]look, n)
		for i := range out {
			out[i].took = took
		}
		return out
	}
	tests := map[string]struct {
		looks   []look
		refused bool
		// lastLook is the look (0-based) that settles it.
		lastLook int
	}{
		// A loss: nothing seen; the look that begins 3 s after the
		// first (each takes 0.1 s, then 0.5 s between: at 3.0 s)
		// settles it.
		"a loss": {looks: quiet(10, 100*time.Millisecond), lastLook: 5},
		// The majority of a partition is still electing at the first
		// look, which waits 3.5 s for a curator; by the second look it
		// has its leader, and the refusal comes at the first look past
		// 6 s. Counting the first look's end would have settled it at
		// once, and recovered the minority.
		"a slow look at a partition": {
			looks:    append([]look{{took: 3500 * time.Millisecond}}, leader(10)...),
			refused:  true,
			lastLook: 6,
		},
		// A survivor names its old leader for a while after the loss.
		"an old leader named at first": {
			looks:    append([]look{{seen: "old leader"}, {seen: "old leader"}}, quiet(10, 100*time.Millisecond)...),
			lastLook: 7,
		},
		// Every look (0.5 s apart) sees a quorum: refused at the first
		// past 6 s.
		"a partition": {
			looks:    leader(20),
			refused:  true,
			lastLook: 13,
		},
		// Nothing seen, then a quorum (an election finished): the
		// window starts again.
		"an election that finishes late": {
			looks:    append(append(quiet(4, 100*time.Millisecond), look{seen: "leader"}), quiet(10, 100*time.Millisecond)...),
			lastLook: 10,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
			clk := clock{now: func() time.Time { return now }, sleep: func(_ context.Context, d time.Duration) error {
				now = now.Add(d)
				return nil
			}}
			i := -1
			err := awaitLoss(context.Background(), settle, clk, func(context.Context) string {
				i++
				if i >= len(tc.looks) {
					t.Fatalf("look %d: still looking after every scripted look", i)
				}
				now = now.Add(tc.looks[i].took)
				return tc.looks[i].seen
			})
			switch {
			case tc.refused && (err == nil || !strings.Contains(err.Error(), "a quorum is reachable")):
				t.Fatalf("after look %d: %v, want refused: a quorum is reachable", i, err)
			case !tc.refused && err != nil:
				t.Fatalf("after look %d: %v, want a loss", i, err)
			}
			if i != tc.lastLook {
				t.Errorf("settled by look %d, want look %d", i, tc.lastLook)
			}
		})
	}

	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		err := awaitLoss(ctx, settle, realClock, func(context.Context) string { cancel(); return "" })
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%v, want context.Canceled", err)
		}
	})
}
