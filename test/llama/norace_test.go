//go:build !race

package llama_test

const raceEnabled = false
