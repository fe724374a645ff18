package tcp

import (
	"fmt"
	"net"
	"testing"

	"github.com/pdserve/pdserve/internal/kvxfer"
)

// benchChunkBytes is the KV_CHUNK data size in BenchmarkTransfer: 8 pages
// of 128 KiB (16 tokens of a Llama-3-8B-shaped KV cache).
const benchChunkBytes = 1 << 20

// BenchmarkTransfer moves rooms × MiB of KV_CHUNK frames from a prefill
// Backend to a decode Backend over loopback, and the same bytes over a bare
// TCP connection written with writev and read into one reused buffer
// ("raw"), the ceiling for the transport. "pdserve" recycles received Data
// buffers through Config.AllocData, as a decode worker does once it copied
// the KV into its pages; "pdserve-noreuse" allocates one per frame (and so
// also measures the garbage collector). Compare with benchstat:
//
//	go test -run '^$' -bench Transfer -count 10 ./internal/kvxfer/tcp
func BenchmarkTransfer(b *testing.B) {
	for _, tc := range []struct{ rooms, mib int }{{1, 64}, {16, 4}, {64, 1}} {
		name := fmt.Sprintf("rooms=%d/MiB=%d", tc.rooms, tc.mib)
		b.Run(name+"/pdserve", func(b *testing.B) { benchBackend(b, tc.rooms, tc.mib, true) })
		b.Run(name+"/pdserve-noreuse", func(b *testing.B) { benchBackend(b, tc.rooms, tc.mib, false) })
		b.Run(name+"/raw", func(b *testing.B) { benchRaw(b, tc.rooms, tc.mib) })
	}
}

// sink counts received KV_CHUNK data and signals each time want bytes
// arrived. With free set it hands Data buffers back through it.
type sink struct {
	discardHandler
	want, got int
	done      chan struct{}
	free      chan []byte
}

func (s *sink) HandleMessage(_ kvxfer.PeerID, m kvxfer.Message) {
	if c, ok := m.(kvxfer.KVChunk); ok {
		s.got += len(c.Data)
		if s.free != nil {
			select {
			case s.free <- c.Data:
			default:
			}
		}
		if s.got >= s.want {
			s.got -= s.want
			s.done <- struct{}{}
		}
	}
}

func (s *sink) alloc(n int) []byte {
	select {
	case b := <-s.free:
		if cap(b) >= n {
			return b[:n]
		}
	default:
	}
	return make([]byte, n)
}

func benchBackend(b *testing.B, rooms, mib int, reuse bool) {
	total := rooms * mib << 20
	chunksPerRoom := mib << 20 / benchChunkBytes
	data := make([]byte, benchChunkBytes)
	for i := range data {
		data[i] = byte(i * 7)
	}
	up := make(chan kvxfer.PeerID, 1)
	prefill := New(Config{Fingerprint: testFP, Handler: upHandler(up)})
	defer prefill.Close()
	s := &sink{want: total, done: make(chan struct{}, 1)}
	cfg := Config{Fingerprint: testFP, Handler: s}
	if reuse {
		s.free = make(chan []byte, 4)
		cfg.AllocData = s.alloc
	}
	decode := New(cfg)
	defer decode.Close()
	addr, err := prefill.Listen("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	decode.Connect(addr)
	peer := <-up
	b.SetBytes(int64(total))
	b.ResetTimer()
	for range b.N {
		for r := range rooms {
			rg := roomGen(r)
			for c := range chunksPerRoom {
				m := kvxfer.KVChunk{RoomGen: rg, Seq: uint32(c), FirstPage: uint32(8 * c), NPages: 8, Data: data}
				if err := prefill.Send(peer, m); err != nil {
					b.Fatal(err)
				}
			}
		}
		<-s.done
	}
}

type upHandler chan kvxfer.PeerID

func (h upHandler) PeerUp(p kvxfer.PeerID, _ string)          { h <- p }
func (upHandler) HandleMessage(kvxfer.PeerID, kvxfer.Message) {}
func (upHandler) PeerLost(kvxfer.PeerID, error)               {}

func benchRaw(b *testing.B, rooms, mib int) {
	total := rooms * mib << 20
	chunks := total / benchChunkBytes
	data := make([]byte, benchChunkBytes)
	hdr, err := kvxfer.AppendFrameHeader(nil, kvxfer.KVChunk{NPages: 8, Data: data})
	if err != nil {
		b.Fatal(err)
	}
	wire := chunks * (len(hdr) + len(data))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- nc
	}()
	w, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	r, ok := <-accepted
	if !ok {
		b.Fatal("accept failed")
	}
	defer r.Close()
	done := make(chan error, 1)
	buf := make([]byte, benchChunkBytes)
	b.SetBytes(int64(total))
	b.ResetTimer()
	for range b.N {
		go func() {
			var err error
			for got := 0; got < wire && err == nil; {
				var n int
				n, err = r.Read(buf)
				got += n
			}
			done <- err
		}()
		for range chunks {
			bufs := net.Buffers{hdr, data}
			if _, err := bufs.WriteTo(w); err != nil {
				b.Fatal(err)
			}
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
}
