package router

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/pdserve/pdserve/internal/registry"
	"github.com/pdserve/pdserve/internal/workerapi"
)

// TestTransportClosesConnectionsTheWorkerClosed: a worker that closes its
// side of an idle pooled connection (it stopped or restarted) gets the
// router's side closed by the next sweep, long before the idle timeout,
// instead of leaving it in CLOSE-WAIT; the worker sees EOF.
func TestTransportClosesConnectionsTheWorkerClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hangUp := make(chan struct{})
	seen := make(chan error, 1) // what the worker reads after its FIN
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			seen <- err
			return
		}
		defer c.Close()
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			seen <- err
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		<-hangUp
		_ = c.(*net.TCPConn).CloseWrite()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = c.Read(make([]byte, 1))
		seen <- err
	}()
	stays, _ := newCountingServer(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {}))
	clk := testingclock.NewFakePassiveClock(time.Unix(1000, 0))
	tr := &Transport{IdleConnTimeout: time.Hour, Clock: clk}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	get := func(url string) {
		t.Helper()
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	get("http://" + ln.Addr().String())
	close(hangUp)
	deadline := time.Now().Add(5 * time.Second)
	for {
		clk.SetTime(clk.Now().Add(sweepInterval))
		get(stays.URL) // any call sweeps every pool
		select {
		case err := <-seen:
			if !errors.Is(err, io.EOF) {
				t.Fatalf("the worker read %v after its FIN, want EOF (the router closing its side)", err)
			}
			tr.mu.Lock()
			n := len(tr.idle["http://"+ln.Addr().String()])
			tr.mu.Unlock()
			if n != 0 {
				t.Fatalf("%d connections to the worker still pooled", n)
			}
			return
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the router kept its side of a connection the worker closed (CLOSE-WAIT) for 5 s of sweeps")
		}
	}
}

// TestRemovedWorkerConnectionsClosed: when a worker leaves the fleet, the
// router closes its idle connections to it at once: the worker's server
// sees every connection it accepted closed.
func TestRemovedWorkerConnectionsClosed(t *testing.T) {
	var (
		mu             sync.Mutex
		opened, closed int
	)
	w := &fakeWorker{role: workerapi.RoleColocated}
	w.leg = okLeg(workerapi.RoleColocated)
	srv := httptest.NewUnstartedServer(w)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch s {
		case http.StateNew:
			opened++
		case http.StateClosed, http.StateHijacked:
			closed++
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	r, _ := socketRouter(t, srv.URL)
	if ok, why := r.Serving(); !ok {
		t.Fatalf("router not serving: %s", why)
	}
	wk := r.Fleet().Workers("")[0]
	if !r.Fleet().Registry().(*registry.Static).Remove(wk.ID()) {
		t.Fatalf("%s not removed", wk.ID())
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		o, c := opened, closed
		mu.Unlock()
		if o > 0 && o == c {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the worker left the fleet: %d of the %d connections the router opened to it closed", c, o)
		}
		<-time.After(10 * time.Millisecond)
	}
}
