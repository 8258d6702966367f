// Command branches takes one branch or the other, by whether it has an
// argument: curia-cover's tests run it built with -cover.
package main

import "os"

func main() {
	if len(os.Args) > 1 {
		os.Stdout.WriteString("an argument\n")
		return
	}
	os.Stdout.WriteString("no argument\n")
}
