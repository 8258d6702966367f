// Command untilterm says "up" and runs until SIGTERM, then returns from
// main, as curia's services do (platform/run.Main): proctest's tests run
// it to see what a test's end leaves of a process.
package main

import (
	"context"
	"fmt"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fmt.Println("up")
	<-ctx.Done()
	fmt.Println("terminated")
}
