package run_test

import (
	"context"
	"fmt"

	"curia.dev/platform/run"
)

// A service reports readiness to the gRPC health server from a part of its
// own that waits for the others.
func ExampleGroup_WaitReady() {
	ctx, cancel := context.WithCancel(context.Background())
	var g run.Group
	g.Add("store", func(ctx context.Context) error {
		// ... open the store ...
		g.Ready("store")
		<-ctx.Done()
		return nil
	})
	g.Add("health", func(ctx context.Context) error {
		g.Ready("health")
		if err := g.WaitReady(ctx); err != nil {
			return nil // stopped before ready
		}
		fmt.Println("SERVING") // srv.Health().SetServingStatus("", SERVING)
		cancel()               // end the example
		<-ctx.Done()
		return nil
	})
	fmt.Println(g.Run(ctx))
	// Output:
	// SERVING
	// <nil>
}
