// Command hello prints its arguments: a main package for testbin's tests.
package main

import (
	"fmt"
	"os"
)

func main() { fmt.Println(os.Args[1:]) }
