//go:build race

package testbin

// raceBuild: a test binary built with -race builds the commands it runs
// with -race too, so they reuse its race-instrumented packages from the
// build cache instead of compiling every package a second time, and the
// processes under test are checked for data races as well.
const raceBuild = true
