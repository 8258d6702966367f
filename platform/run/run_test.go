package run

import (
	"context"
	"errors"
	"maps"
	"testing"

	"curia.dev/platform/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// blocker runs until its context ends and reports that it started.
func blocker(started chan<- string, name string, onStop error) Runnable {
	return func(ctx context.Context) error {
		started <- name
		<-ctx.Done()
		return onStop
	}
}

func TestRunReturnValues(t *testing.T) {
	errBoom := errors.New("boom")
	errFlush := errors.New("flush failed")
	tests := map[string]struct {
		// parts other than "trigger" block until the group context ends
		// and then return their onStop error.
		onStop map[string]error
		// trigger, if set, returns triggerErr once every blocker started;
		// otherwise the test cancels the parent context.
		trigger    bool
		triggerErr error
		wantErr    error  // matched with errors.Is; nil means Run returns nil
		wantPrefix string // expected start of the error message
	}{
		"parent cancel, parts return nil": {
			onStop: map[string]error{"a": nil, "b": nil},
		},
		"parent cancel, parts return ctx.Err": {
			onStop: map[string]error{"a": context.Canceled, "b": context.Canceled},
		},
		"parent cancel, a part fails while stopping": {
			onStop:     map[string]error{"a": nil, "b": errFlush},
			wantErr:    errFlush,
			wantPrefix: "run b: ",
		},
		"first failure wins over shutdown errors": {
			onStop:     map[string]error{"a": errFlush, "b": context.Canceled},
			trigger:    true,
			triggerErr: errBoom,
			wantErr:    errBoom,
			wantPrefix: "run trigger: ",
		},
		"a part returning nil early stops the group": {
			onStop:     map[string]error{"a": nil},
			trigger:    true,
			triggerErr: nil,
			wantErr:    ErrExited,
			wantPrefix: "run trigger: ",
		},
		"a part returning Canceled on its own is a failure": {
			onStop:     map[string]error{"a": nil},
			trigger:    true,
			triggerErr: context.Canceled,
			wantErr:    context.Canceled,
			wantPrefix: "run trigger: ",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var g Group
			started := make(chan string, len(tc.onStop))
			for n, err := range tc.onStop {
				g.Add(n, blocker(started, n, err))
			}
			allStarted := make(chan struct{})
			go func() {
				for range tc.onStop {
					<-started
				}
				close(allStarted)
			}()
			if tc.trigger {
				g.Add("trigger", func(ctx context.Context) error {
					<-allStarted
					return tc.triggerErr
				})
			}

			done := make(chan error, 1)
			go func() { done <- g.Run(ctx) }()
			if !tc.trigger {
				<-allStarted
				cancel()
			}
			err := <-done

			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Run = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Run = %v, want %v", err, tc.wantErr)
			}
			if msg := err.Error(); len(msg) < len(tc.wantPrefix) || msg[:len(tc.wantPrefix)] != tc.wantPrefix {
				t.Fatalf("Run = %q, want prefix %q", msg, tc.wantPrefix)
			}
		})
	}
}

func TestRunWithoutParts(t *testing.T) {
	var g Group
	if err := g.Run(t.Context()); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if err := g.Run(t.Context()); err == nil {
		t.Fatal("second Run succeeded")
	}
}

func TestReadiness(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var g Group
	release := make(chan struct{})
	g.Add("server", func(ctx context.Context) error {
		g.Ready("server")
		<-ctx.Done()
		return nil
	})
	g.Add("store", func(ctx context.Context) error {
		<-release // warm-up
		g.Ready("store")
		<-ctx.Done()
		return nil
	})
	var serving bool
	g.Add("health", func(ctx context.Context) error {
		g.Ready("health")
		if err := g.WaitReady(ctx); err != nil {
			return nil // stopped before ready
		}
		serving = true // e.g. Health().SetServingStatus("", SERVING)
		<-ctx.Done()
		return nil
	})

	runErr := make(chan error, 1)
	go func() { runErr <- g.Run(ctx) }()

	waited := make(chan error, 1)
	go func() { waited <- g.WaitReady(ctx) }()
	select {
	case err := <-waited:
		t.Fatalf("WaitReady returned %v before store was ready", err)
	default:
	}
	if g.Readiness()["store"] {
		t.Fatal("store ready before release")
	}

	close(release)
	if err := <-waited; err != nil {
		t.Fatalf("WaitReady = %v", err)
	}
	want := map[string]bool{"server": true, "store": true, "health": true}
	if got := g.Readiness(); !maps.Equal(got, want) {
		t.Fatalf("Readiness = %v, want %v", got, want)
	}

	cancel()
	if err := <-runErr; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if !serving {
		t.Fatal("health part never saw the group ready")
	}
}

func TestWaitReadyEnds(t *testing.T) {
	t.Run("group stops first", func(t *testing.T) {
		var g Group
		g.Add("failing", func(context.Context) error { return errors.New("no disk") })
		if err := g.Run(t.Context()); err == nil {
			t.Fatal("Run = nil, want error")
		}
		if err := g.WaitReady(t.Context()); !errors.Is(err, ErrStopped) {
			t.Fatalf("WaitReady = %v, want ErrStopped", err)
		}
	})
	t.Run("context ends first", func(t *testing.T) {
		var g Group
		g.Add("never ready", func(ctx context.Context) error { <-ctx.Done(); return nil })
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := g.WaitReady(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("WaitReady = %v, want context.Canceled", err)
		}
	})
}

func TestMisusePanics(t *testing.T) {
	noop := func(ctx context.Context) error { <-ctx.Done(); return nil }
	tests := map[string]func(g *Group){
		"duplicate name": func(g *Group) { g.Add("a", noop); g.Add("a", noop) },
		"unknown ready":  func(g *Group) { g.Ready("nope") },
		"add after run": func(g *Group) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_ = g.Run(ctx)
			g.Add("late", noop)
		},
	}
	for name, misuse := range tests {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			misuse(&Group{})
		})
	}
}
