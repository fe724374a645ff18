package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"runtime/debug"
	"strings"
	"sync"
	"time"
)

// worker runs schema files one at a time.
type worker interface {
	run(path string) schemaResult
	close()
}

// inProcess runs schemas in this process: a panic is recovered, a slow
// schema stops at its budget between tokens, but a hung call, a stack
// overflow or running out of memory ends the run.
type inProcess struct {
	e engine
	o runOptions
}

func (w inProcess) run(path string) schemaResult { return runFile(w.e, path, w.o) }
func (w inProcess) close()                       {}

// wireOptions are runOptions as the first line a worker process reads.
type wireOptions struct {
	Compact  bool  `json:"compact"`
	Flexible bool  `json:"flexible"`
	AnyOrder bool  `json:"any_order"`
	BudgetNS int64 `json:"budget_ns"`
}

// procWorker runs schemas in a child process (this program with -worker)
// that it restarts when it dies: a crash or a hang costs the schema at
// hand, never the run. The child gets the budget too and stops between
// tokens; the parent kills it at budget+grace.
type procWorker struct {
	spawn func() *exec.Cmd
	o     runOptions
	grace time.Duration

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan []byte
	stderr *tail
}

func newProcWorker(spawn func() *exec.Cmd, o runOptions, grace time.Duration) *procWorker {
	return &procWorker{spawn: spawn, o: o, grace: grace}
}

func (w *procWorker) start() error {
	cmd := w.spawn()
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	w.stderr = &tail{max: 4096}
	cmd.Stderr = w.stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	hdr, _ := json.Marshal(wireOptions{Compact: w.o.ser.compact, Flexible: w.o.flexible, AnyOrder: w.o.anyOrder, BudgetNS: int64(w.o.budget)})
	if _, err := fmt.Fprintf(in, "%s\n", hdr); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return err
	}
	lines := make(chan []byte)
	go func() {
		defer close(lines)
		r := bufio.NewReader(out)
		for {
			b, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			lines <- b
		}
	}()
	w.cmd, w.stdin, w.lines = cmd, in, lines
	return nil
}

// stop ends the child (killing it if kill) and waits for it.
func (w *procWorker) stop(kill bool) {
	if w.cmd == nil {
		return
	}
	w.stdin.Close()
	if kill {
		w.cmd.Process.Kill()
	}
	for range w.lines {
	}
	w.cmd.Wait()
	w.cmd = nil
}

func (w *procWorker) run(path string) schemaResult {
	res := schemaResult{File: path, Split: splitOf(path)}
	if w.cmd == nil {
		if err := w.start(); err != nil {
			res.Class, res.Msg = classCrash, "starting a worker: "+err.Error()
			return res
		}
	}
	if _, err := fmt.Fprintln(w.stdin, path); err != nil {
		w.stop(true)
		res.Class, res.Msg = classCrash, "worker gone: "+err.Error()
		return res
	}
	timer := time.NewTimer(w.o.budget + w.grace)
	defer timer.Stop()
	select {
	case b, ok := <-w.lines:
		if !ok {
			w.stop(false)
			res.Class, res.Msg = classCrash, "the worker died: "+w.stderr.String()
			return res
		}
		if err := json.Unmarshal(b, &res); err != nil {
			w.stop(true)
			res.Class, res.Msg = classCrash, "unreadable worker output: "+err.Error()
		}
		return res
	case <-timer.C:
		w.stop(true)
		res.Class = classTimeout
		res.Msg = fmt.Sprintf("killed after %v (a call did not return)", w.o.budget+w.grace)
		return res
	}
}

func (w *procWorker) close() { w.stop(false) }

// serveWorker is a worker process's loop: the options line, then a schema
// path per line in, a schemaResult per line out.
func serveWorker(in io.Reader, out io.Writer, e engine) error {
	// Deep recursion fails sooner than at the default 1 GB, and the
	// parent reports it as a crash.
	debug.SetMaxStack(256 << 20)
	r := bufio.NewReader(in)
	hdr, err := r.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("reading options: %v", err)
	}
	var wo wireOptions
	if err := json.Unmarshal(hdr, &wo); err != nil {
		return fmt.Errorf("reading options: %v", err)
	}
	o := runOptions{ser: serializer{compact: wo.Compact}, compileOptions: compileOptions{flexible: wo.Flexible, anyOrder: wo.AnyOrder}, budget: time.Duration(wo.BudgetNS)}
	bw := bufio.NewWriter(out)
	enc := json.NewEncoder(bw)
	for {
		line, err := r.ReadString('\n')
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := enc.Encode(runFile(e, strings.TrimSuffix(line, "\n"), o)); err != nil {
			return err
		}
		if err := bw.Flush(); err != nil {
			return err
		}
	}
}

// runAll runs files on n workers made by newWorker and sends each result
// to results, which it closes at the end.
func runAll(files []string, n int, newWorker func() worker, results chan<- schemaResult) {
	jobs := make(chan string)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := newWorker()
			defer w.close()
			for f := range jobs {
				results <- w.run(f)
			}
		}()
	}
	for _, f := range files {
		jobs <- f
	}
	close(jobs)
	wg.Wait()
	close(results)
}

// tail is an io.Writer that keeps the last max bytes written.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}
