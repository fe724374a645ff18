package lifecycle

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/pdserve/pdserve/internal/grammar"
	"github.com/pdserve/pdserve/internal/kvxfer"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/outcome"
)

// TestTranscripts runs the transcripts in testdata/: each file is a
// scenario of commands that step a prefill and a decode machine (or a
// colocated one) and what each command made them do. Regenerate the output
// with
//
//	go test ./internal/lifecycle -run TestTranscripts -rewrite
//
// and read the diff.
//
// Commands (every one takes at=DUR, the time since the start, or after=DUR,
// to move the clock first):
//
//	node <role> [pages=N] [<config>=V ...] [force-optimistic=(rid, ...)] [force-optimistic-fraction=F]
//	                                         a machine of role prefill, decode or colocated
//	                                         with testConfig, changed by the keys of configKeys;
//	                                         force-optimistic(-fraction) is the optimistic test
//	                                         hook's pick: these ids, or ForceFraction(F)
//	connect                                  open the KV connection (both sides hear PeerUp)
//	disconnect [err=TEXT]                    lose it: frames in flight are lost, both hear PeerLost
//	arrive <node> rid=R [room=NAME] [gen=G] (prompt=N | tokens=(..)) [max_tokens=M]
//	       [ignore_eos] [stop=(..)] [timeout=DUR] [n=N] [top_logprobs=K] [peer=ID]
//	       [choice=(..)]                     a request over HTTP; the room defaults to the rid;
//	                                         choice constrains it to one of the words, spelled
//	                                         in toyVocab's tokens (constraint_test.go)
//	abort <node> [rid=R] [room=NAME] [gen=G] [reason=client|stop|peer-leg] [detail=TEXT]
//	      [cause=(outcome, role, stage)]     the abort API; the input text is the cause's detail
//	tick [<node> ...]                        Tick (every node if none is named)
//	schedule <node>                          Schedule
//	batch-done <node> [err=TEXT]             finish the running forward (the fake model), or fail it
//	io [<node>] [n=N]                        run the N oldest page I/O jobs (default: all)
//	deliver <node> [n=N]                     deliver the N oldest frames in flight to node (default: all)
//	drop <node> [i=K] / dup <node> [i=K]     lose / duplicate frame K in flight to node
//	reorder <node> [i=K]                     swap frames K and K+1 in flight to node
//	replay <node> from=ROOM [from-gen=G] to=ROOM [to-gen=G]
//	                                         the KV frames of FROM node received so far, relabelled
//	                                         with TO, in place of TO's KV frames in flight to node
//	shutdown <node>                          Shutdown
//	drain <node>                             Drain
//	stats <node> / requests <node>           print the gauges / the /debug/requests view
//
// Output: "X >> MSG" is a frame node X sent, "X << MSG" one it received,
// "X: rid a -> b" a request's stage change, other "X:" lines its effects.
// Rooms print by name, times relative to the start.
func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		w := newWorld(t)
		datadriven.RunTest(t, path, w.run)
	})
}

// TestPairTranscriptReplays: a seeded randomized run records the same
// transcript twice (the machines, the world and the recorder are
// deterministic: nothing comes out in map order), and the transcript
// replays through the transcript runner with the same output, so a failing
// seed's printed transcript can be pasted into testdata/.
func TestPairTranscriptReplays(t *testing.T) {
	for _, seed := range []uint64{3, 4, 5} { // with faults, clean, and optimistic with the test hook
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			var a, b string
			runPair(t, seed, seedFaults(seed), &a)
			runPair(t, seed, seedFaults(seed), &b)
			if a != b {
				al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
				for i := range min(len(al), len(bl)) {
					if al[i] != bl[i] {
						t.Fatalf("seed %d does not replay: line %d is\n%s\nthen\n%s", seed, i+1, al[i], bl[i])
					}
				}
				t.Fatalf("seed %d does not replay: %d lines, then %d", seed, len(al), len(bl))
			}
			// Thousands of commands: log none of them unless one fails.
			quiet := flag.Lookup("datadriven-quiet").Value.String()
			if err := flag.Set("datadriven-quiet", "true"); err != nil {
				t.Fatal(err)
			}
			defer flag.Set("datadriven-quiet", quiet)
			w := newWorld(t)
			datadriven.RunTestFromString(t, a, w.run)
		})
	}
}

// run executes one transcript command and returns what it printed.
func (w *world) run(t *testing.T, td *datadriven.TestData) string {
	w.t = t
	var out strings.Builder
	w.out = &out
	a := cmdArgs{t: t, td: td}
	if d, ok := a.dur("at"); ok {
		at := w.start.Add(d)
		if at.Before(w.now) {
			t.Fatalf("%s: at=%s is before the current time %s", td.Pos, d, w.now.Sub(w.start))
		}
		w.now = at
	}
	if d, ok := a.dur("after"); ok {
		w.now = w.now.Add(d)
	}
	switch td.Cmd {
	case "node":
		role := roleNamed(t, a.first())
		cfg := testConfig(role)
		for _, k := range configKeys {
			switch {
			case k.num != nil:
				*k.num(&cfg) = a.int(k.key, *k.num(&cfg))
			case k.flag != nil:
				if v := a.str(k.key, ""); v != "" {
					*k.flag(&cfg) = v == "true"
				}
			case k.frac != nil:
				if v := a.str(k.key, ""); v != "" {
					f, err := strconv.ParseFloat(v, 64)
					if err != nil {
						t.Fatalf("%s: %s=%s: %v", td.Pos, k.key, v, err)
					}
					*k.frac(&cfg) = f
				}
			default:
				if d, ok := a.dur(k.key); ok {
					*k.dur(&cfg) = d
				}
			}
		}
		if arg, ok := td.Arg("force-optimistic"); ok {
			forced := arg.Vals
			cfg.ForceOptimistic = func(rid string) bool { return slices.Contains(forced, rid) }
		}
		force := 0.0
		if v := a.str("force-optimistic-fraction", ""); v != "" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: force-optimistic-fraction=%s: %v", td.Pos, v, err)
			}
			force = f
		}
		w.addNode(cfg, a.int("pages", 16), force)
	case "connect":
		w.connect()
	case "disconnect":
		w.disconnect(a.str("err", "reset"))
	case "arrive":
		n := w.node(a.first())
		q := Request{RID: a.str("rid", ""), Gen: uint32(a.int("gen", 1)), MaxTokens: a.int("max_tokens", 4),
			Sampling: model.SamplingParams{TopP: 1}, IgnoreEOS: td.HasArg("ignore_eos"),
			Peer: kvxfer.PeerID(a.int("peer", 0)), Timeout: a.durOr("timeout", 0), N: a.int("n", 0)}
		q.Sampling.TopLogprobs = a.int("top_logprobs", 0)
		if td.HasArg("tokens") {
			q.InputIDs = a.int32s("tokens")
		} else {
			q.InputIDs = tokens(a.int("prompt", 8))
		}
		q.StopTokenIDs = a.int32s("stop")
		if arg, ok := td.Arg("choice"); ok {
			src, err := json.Marshal(arg.Vals)
			if err != nil {
				t.Fatal(err)
			}
			constrain(t, &q, grammar.Spec{Kind: grammar.KindChoice, Source: string(src)})
		}
		if name := a.str("room", ""); name != "" || n.role != RoleColocated {
			if name == "" {
				name = q.RID
			}
			q.Room = a.room(name)
		}
		w.arrive(n, q)
	case "abort":
		n := w.node(a.first())
		ab := AbortRequest{RID: a.str("rid", ""), Gen: uint32(a.int("gen", 0)), Detail: a.str("detail", "")}
		if name := a.str("room", ""); name != "" {
			ab.Room = a.room(name)
		}
		switch r := a.str("reason", "client"); r {
		case "client":
			ab.Reason = AbortClient
		case "stop":
			ab.Reason = AbortStop
		case "peer-leg":
			ab.Reason = AbortPeerLeg
		default:
			t.Fatalf("%s: unknown abort reason %q", td.Pos, r)
		}
		if arg, ok := td.Arg("cause"); ok {
			if len(arg.Vals) != 3 {
				t.Fatalf("%s: cause=(outcome, role, stage)", td.Pos)
			}
			o, ok := outcome.Parse(arg.Vals[0])
			if !ok {
				t.Fatalf("%s: unknown outcome %q", td.Pos, arg.Vals[0])
			}
			ab.Cause = outcome.Cause{Outcome: o, Role: arg.Vals[1], Stage: arg.Vals[2], Detail: strings.TrimSpace(td.Input)}
		}
		w.abort(n, ab)
	case "tick":
		var ns []*node
		for _, name := range a.bare() {
			ns = append(ns, w.node(name))
		}
		w.tick(ns...)
	case "schedule":
		w.schedule(w.node(a.first()))
	case "batch-done":
		var err error
		if e := a.str("err", ""); e != "" {
			err = errors.New(e)
		}
		w.batchDone(w.node(a.first()), err)
	case "io":
		ns := w.nodes
		if names := a.bare(); len(names) > 0 {
			ns = nil
			for _, name := range names {
				ns = append(ns, w.node(name))
			}
		}
		for _, n := range ns {
			if k := a.int("n", len(n.io)); k > 0 {
				w.runIO(n, k)
			}
		}
	case "deliver":
		n := w.node(a.first())
		w.deliver(n, a.int("n", len(n.inbox)))
	case "drop":
		w.drop(w.node(a.first()), a.int("i", 0))
	case "dup":
		w.dup(w.node(a.first()), a.int("i", 0))
	case "replay":
		from := kvxfer.RoomGen{Room: a.room(a.str("from", "")), Gen: uint32(a.int("from-gen", 1))}
		to := kvxfer.RoomGen{Room: a.room(a.str("to", "")), Gen: uint32(a.int("to-gen", 1))}
		w.replay(w.node(a.first()), from, to)
	case "shutdown":
		w.shutdown(w.node(a.first()))
	case "drain":
		w.drain(w.node(a.first()))
	case "reorder":
		w.reorder(w.node(a.first()), a.int("i", 0))
	case "stats":
		w.printStats(w.node(a.first()))
	case "requests":
		w.printRequests(w.node(a.first()))
	default:
		t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
	}
	return out.String()
}

func roleNamed(t *testing.T, s string) Role {
	for _, r := range []Role{RolePrefill, RoleDecode, RoleColocated} {
		if r.String() == s {
			return r
		}
	}
	t.Fatalf("unknown role %q", s)
	return 0
}

func (w *world) printStats(n *node) {
	s := n.m.Stats(w.now)
	w.say(n, "live %d, pages %d/%d, pending opens %d, tombstones %d", s.Live, s.PagesUsed, s.PagesTotal, s.PendingOpens, s.Tombstones)
	if s.Draining {
		w.say(n, "  draining, drained %v", s.Drained)
	}
	if n.m.cfg.PrefixCache {
		w.say(n, "  prefix cache: %d pages cached, %d of %d tokens hit, %d evictions", s.PagesCached,
			s.Counters.PrefixHitTokens, s.Counters.PrefixQueriedTokens, s.Counters.PrefixEvictions)
	}
	if s.UnboundComputingPages+s.UnboundParkedPages > 0 {
		w.say(n, "  optimistic KV: %d pages computing, %d parked", s.UnboundComputingPages, s.UnboundParkedPages)
	}
	var st []string
	for _, stage := range n.role.Stages() {
		if c := s.Stages[stage]; c > 0 {
			st = append(st, fmt.Sprintf("%s=%d (oldest %s)", stage, c, s.OldestInStage[stage]))
		}
	}
	if len(st) > 0 {
		w.say(n, "  stages: %s", strings.Join(st, " "))
	}
	var cs []string
	c := s.Counters
	for _, reason := range []string{"unknown_room", "stale_gen", "wrong_peer", "wrong_state", "wrong_role", "duplicate", "malformed", "wrong_binding"} {
		if v := c.FramesDropped[reason]; v > 0 {
			cs = append(cs, fmt.Sprintf("dropped_%s=%d", reason, v))
		}
	}
	for _, kv := range []struct {
		k string
		v uint64
	}{{"tombstone_hits", c.TombstoneHits}, {"peer_abort_tombstones", c.PeerAbortTombstones},
		{"aborts_acked", c.AbortsAcked}, {"pending_opens_expired", c.PendingOpensExpired},
		{"preemptions", c.Preemptions}} {
		if kv.v > 0 {
			cs = append(cs, fmt.Sprintf("%s=%d", kv.k, kv.v))
		}
	}
	for _, o := range OptimisticOutcomes() {
		if v := c.Optimistic[o]; v > 0 {
			cs = append(cs, fmt.Sprintf("optimistic_%s=%d", o, v))
		}
	}
	if len(cs) > 0 {
		w.say(n, "  counters: %s", strings.Join(cs, " "))
	}
}

func (w *world) printRequests(n *node) {
	secs := func(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }
	for _, ri := range n.m.Requests(w.now) {
		room := "-"
		if ri.Room != "" {
			room = w.clean(ri.Room)
		}
		w.say(n, "%s %s room=%s/%d age=%s in_stage=%s deadline_left=%s budget=%s peer=%d pages=%d prompt=%d output=%d last=%q",
			ri.RID, ri.Stage, room, ri.Gen, secs(ri.AgeSeconds), secs(ri.InStageSecs), secs(ri.DeadlineLeft), secs(ri.StageBudget),
			ri.Peer, ri.Pages, ri.PromptTokens, ri.OutputTokens, w.clean(ri.LastEvent))
		if ri.Optimistic {
			w.say(n, "  %s: optimistic (not bound to its room)", ri.RID)
		}
	}
}

// cmdArgs reads a command's arguments; a malformed one fails the test.
type cmdArgs struct {
	t  *testing.T
	td *datadriven.TestData
}

// bare lists the arguments without a value (node names, flags).
func (a cmdArgs) bare() []string {
	var out []string
	for _, arg := range a.td.CmdArgs {
		if len(arg.Vals) == 0 && arg.Key != "ignore_eos" {
			out = append(out, arg.Key)
		}
	}
	return out
}

func (a cmdArgs) first() string {
	b := a.bare()
	if len(b) == 0 {
		a.t.Fatalf("%s: %s needs a node", a.td.Pos, a.td.Cmd)
	}
	return b[0]
}

func (a cmdArgs) str(key, def string) string {
	if arg, ok := a.td.Arg(key); ok {
		return arg.SingleVal(a.t)
	}
	return def
}

func (a cmdArgs) int(key string, def int) int {
	s := a.str(key, "")
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		a.t.Fatalf("%s: %s=%s: %v", a.td.Pos, key, s, err)
	}
	return v
}

func (a cmdArgs) dur(key string) (time.Duration, bool) {
	s := a.str(key, "")
	if s == "" {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		a.t.Fatalf("%s: %s=%s: %v", a.td.Pos, key, s, err)
	}
	return d, true
}

func (a cmdArgs) durOr(key string, def time.Duration) time.Duration {
	if d, ok := a.dur(key); ok {
		return d
	}
	return def
}

func (a cmdArgs) int32s(key string) []int32 {
	arg, ok := a.td.Arg(key)
	if !ok {
		return nil
	}
	out := make([]int32, len(arg.Vals))
	for i, s := range arg.Vals {
		v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 32)
		if err != nil {
			a.t.Fatalf("%s: %s: %v", a.td.Pos, key, err)
		}
		out[i] = int32(v)
	}
	return out
}

func (a cmdArgs) room(name string) kvxfer.Room {
	r, err := roomNamed(name)
	if err != nil {
		a.t.Fatalf("%s: %v", a.td.Pos, err)
	}
	return r
}
