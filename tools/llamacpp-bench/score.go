package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pdserve/pdserve/internal/kvcache"
	"github.com/pdserve/pdserve/internal/model"
	"github.com/pdserve/pdserve/internal/model/llama"
)

// scoreLens are the lengths of the prompts whose prompt logprobs -score
// compares.
var scoreLens = [...]int{17, 130, 512}

// scoreTop is how many of the most likely tokens -score compares at each
// position; scoreLookup is how many bench.mjs reports, so that an id of
// pdserve's top scoreTop that llama.cpp ranks a little lower can be looked
// up in llama.cpp's distribution.
const (
	scoreTop    = 5
	scoreLookup = 10
)

// scoreTol is the largest |Δ logprob| (natural log) -score accepts between
// pdserve and llama.cpp, and the logprob gap within which two candidates
// count as tied (their order may swap).
const scoreTol = 1e-4

// llamaScores is bench.mjs score's output: for each sequence, entry j−1 of
// each list for prompt position j (token j given tokens 0…j−1).
type llamaScores struct {
	Threads int     `json:"threads"`
	Chunk   int     `json:"chunk"`
	Seconds float64 `json:"seconds"`
	Seqs    []struct {
		N        int       `json:"n"`
		Logprobs []float64 `json:"logprobs"`
		// Norm is ln Σp of node-llama-cpp's float32-normalised
		// probabilities; Logprobs are renormalised in float64, so
		// Logprobs + Norm is what the addon's probabilities give.
		Norm []float64      `json:"norm"`
		Top  [][][2]float64 `json:"top"` // [id, logprob], most likely first
	} `json:"seqs"`
}

// scoreStats is the comparison of one GGUF file's prompt logprobs.
type scoreStats struct {
	positions   int
	maxDiff     float64 // max |Δ| of the prompt tokens' logprobs (llama.cpp renormalised in float64)
	maxAt       string  // where: "seq/len position"
	sumDiff     float64 // Σ |Δ|, for the mean
	sumSigned   float64 // Σ Δ (pdserve − llama.cpp), for the bias
	maxRawDiff  float64 // max |Δ| against the addon's float32-normalised probabilities
	maxNorm     float64 // max |ln Σp| of those
	maxTopDiff  float64 // max |Δ| of the top logprobs of ids both list
	perSeqMax   []float64
	topSame     int     // positions whose top ids are identical, in order
	topTies     int     // positions whose top ids differ only between candidates within scoreTol
	topDiffer   int     // positions where they differ otherwise
	maxTopSwap  float64 // largest llama.cpp logprob gap of a differing rank
	llamaSecond float64
}

// scoreSeqs are the prompts of -score: deterministic random ids (an LCG,
// as reference's prompt), avoiding the placeholder vocabulary's first 259
// ids (special and byte tokens).
func scoreSeqs(vocab int) [][]int32 {
	var seqs [][]int32
	for i, n := range scoreLens {
		x := uint32(777 + 1000*i)
		s := make([]int32, n)
		for j := range s {
			x = x*1664525 + 1013904223
			s[j] = int32(259 + x>>8%uint32(vocab-259))
		}
		seqs = append(seqs, s)
	}
	return seqs
}

// pdserveScores runs pdserve's prompt logprobs on seqs as chunked prefill
// would: every step, one Forward over each unfinished sequence's next chunk
// of at most chunk tokens, every position scored with scoreTop
// alternatives (Score[j] the next prompt token, −1 after the last), F32 KV
// cache. It returns each sequence's Scores, one per token.
func pdserveScores(path string, threads, chunk int, seqs [][]int32) [][]model.PositionLogprobs {
	m, err := llama.Load(path, llama.Options{Threads: threads})
	must(err)
	defer m.Close()
	geo := m.Info().Geometry
	const pageSize = 16
	total := 0
	for _, s := range seqs {
		total += (len(s) + pageSize - 1) / pageSize * pageSize
	}
	pool, err := kvcache.NewPool(geo, pageSize, int64(total*geo.BytesPerToken()))
	must(err)
	pages := make([][]kvcache.PageID, len(seqs))
	for i, s := range seqs {
		var ok bool
		if pages[i], ok = pool.Alloc(pool.PagesFor(len(s))); !ok {
			log.Fatal("KV pool exhausted")
		}
	}
	res := make([][]model.PositionLogprobs, len(seqs))
	pos := make([]int, len(seqs))
	for {
		var idx []int
		var in []model.SeqInput
		for i, s := range seqs {
			if pos[i] == len(s) {
				continue
			}
			n := min(chunk, len(s)-pos[i])
			score := make([]int32, n)
			for j := range score {
				score[j] = -1
				if next := pos[i] + j + 1; next < len(s) {
					score[j] = s[next]
				}
			}
			idx = append(idx, i)
			in = append(in, model.SeqInput{Pages: pages[i], Pos: pos[i], Tokens: s[pos[i] : pos[i]+n], Score: score, ScoreTop: scoreTop})
		}
		if len(in) == 0 {
			return res
		}
		out := make([]model.SeqOutput, len(in))
		must(m.Forward(context.Background(), pool, in, out))
		for k, i := range idx {
			res[i] = append(res[i], out[k].Scores...)
			pos[i] += len(in[k].Tokens)
		}
	}
}

// compareScores compares pdserve's prompt logprobs (pd, from
// pdserveScores) with llama.cpp's (ll) on seqs.
func compareScores(seqs [][]int32, pd [][]model.PositionLogprobs, ll llamaScores) scoreStats {
	if len(ll.Seqs) != len(seqs) {
		log.Fatalf("bench.mjs score: %d sequences, want %d", len(ll.Seqs), len(seqs))
	}
	st := scoreStats{llamaSecond: ll.Seconds}
	for i, s := range seqs {
		l := ll.Seqs[i]
		if len(pd[i]) != len(s) || len(l.Logprobs) != len(s)-1 || len(l.Top) != len(s)-1 || len(l.Norm) != len(s)-1 {
			log.Fatalf("sequence %d: %d pdserve scores, %d llama.cpp logprobs, for %d tokens", i, len(pd[i]), len(l.Logprobs), len(s))
		}
		seqMax := 0.0
		for j := 1; j < len(s); j++ {
			p := pd[i][j-1]
			if p.Token.ID != s[j] {
				log.Fatalf("sequence %d position %d: pdserve scored token %d, want %d", i, j, p.Token.ID, s[j])
			}
			d := float64(p.Token.Logprob) - l.Logprobs[j-1]
			st.positions++
			st.sumDiff += math.Abs(d)
			st.sumSigned += d
			seqMax = max(seqMax, math.Abs(d))
			if math.Abs(d) > st.maxDiff {
				st.maxDiff, st.maxAt = math.Abs(d), fmt.Sprintf("%d/%d", j, len(s))
			}
			st.maxRawDiff = max(st.maxRawDiff, math.Abs(d-l.Norm[j-1]))
			st.maxNorm = max(st.maxNorm, math.Abs(l.Norm[j-1]))
			// llama.cpp's logprobs of the ids it lists.
			llp := map[int32]float64{}
			for _, e := range l.Top[j-1] {
				llp[int32(e[0])] = e[1]
			}
			same, tie := true, true
			for r, e := range p.Top {
				if r >= len(l.Top[j-1]) {
					log.Fatalf("sequence %d position %d: llama.cpp lists %d top tokens", i, j, len(l.Top[j-1]))
				}
				if v, ok := llp[e.ID]; ok {
					st.maxTopDiff = max(st.maxTopDiff, math.Abs(float64(e.Logprob)-v))
				}
				want := l.Top[j-1][r]
				if e.ID == int32(want[0]) {
					continue
				}
				// A differing rank is a tie if llama.cpp gives pdserve's id
				// a logprob within scoreTol of its own at that rank.
				same = false
				gap := math.Inf(1)
				if v, ok := llp[e.ID]; ok {
					gap = want[1] - v
				}
				st.maxTopSwap = max(st.maxTopSwap, gap)
				tie = tie && gap <= scoreTol
			}
			switch {
			case same:
				st.topSame++
			case tie:
				st.topTies++
			default:
				st.topDiffer++
			}
		}
		st.perSeqMax = append(st.perSeqMax, seqMax)
	}
	return st
}

// runScore compares pdserve's prompt logprobs with llama.cpp's on each
// file (see the README) and prints a table; it returns false if any
// file's largest |Δ| exceeds scoreTol.
func runScore(work string, threads, chunk int, files []llama.FileType, ggufs map[llama.FileType]string) bool {
	m, err := llama.Load(ggufs[files[0]], llama.Options{})
	must(err)
	vocab := m.Info().VocabSize
	must(m.Close())
	seqs := scoreSeqs(vocab)
	seqPath := filepath.Join(work, "score-seqs.json")
	must(os.WriteFile(seqPath, mustJSON(seqs), 0o644))
	ok := true
	var rows []string
	pds := map[llama.FileType][][]model.PositionLogprobs{}
	lls := map[llama.FileType]llamaScores{}
	for _, ft := range files {
		log.Printf("%s: pdserve prompt logprobs", ft)
		pd := pdserveScores(ggufs[ft], threads, chunk, seqs)
		log.Printf("%s: llama.cpp prompt logprobs (bench.mjs score)", ft)
		out := node(work, threads, "score", "--model", ggufs[ft], "--seqs", seqPath, "--chunk", strconv.Itoa(chunk), "--top", strconv.Itoa(scoreLookup))
		var ll llamaScores
		must(json.Unmarshal([]byte(lastLine(out)), &ll))
		pds[ft], lls[ft] = pd, ll
		st := compareScores(seqs, pd, ll)
		verdict := "ok"
		if !(st.maxDiff <= scoreTol) {
			verdict, ok = "FAIL", false
		}
		var per []string
		for _, v := range st.perSeqMax {
			per = append(per, fmt.Sprintf("%.1e", v))
		}
		rows = append(rows, fmt.Sprintf("| %s | %d | %.2e (position %s) | %s | %.1e | %+.1e | %.1e | %.1e | %.1e | %d / %d / %d | %.1e | %s |",
			ft, st.positions, st.maxDiff, st.maxAt, strings.Join(per, ", "), st.sumDiff/float64(st.positions), st.sumSigned/float64(st.positions),
			st.maxTopDiff, st.maxRawDiff, st.maxNorm, st.topSame, st.topTies, st.topDiffer, st.maxTopSwap, verdict))
		log.Printf("%s", rows[len(rows)-1])
	}
	var lens []string
	for _, n := range scoreLens {
		lens = append(lens, strconv.Itoa(n))
	}
	fmt.Printf("\nprompt logprobs, pdserve against llama.cpp on the same GGUF file: %s-token prompts, prefilled in chunks of %d tokens on both sides, F32 KV cache, %d threads; Δ = pdserve − llama.cpp (natural log); tolerance %.0e\n\n",
		strings.Join(lens, ", "), chunk, threads, scoreTol)
	fmt.Printf("| weights | positions | max abs Δ | max abs Δ per prompt | mean abs Δ | mean Δ | max abs Δ top-%d | max abs Δ, addon's float32 normalisation | max abs ln Σp | top-%d same / ties / differ | max top gap | verdict |\n", scoreTop, scoreTop)
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Println(r)
	}
	if ref, has := lls[llama.FileF32]; has && len(files) > 1 {
		// The F32 file is the checkpoint's bf16 weights widened exactly:
		// llama.cpp's logprobs on it are the model computed in float32,
		// the reference both sides approximate on the other files.
		refLP := func(i, j int) float64 { return ref.Seqs[i].Logprobs[j-1] }
		fmt.Printf("\nagainst llama.cpp on the F32 file (the same weights unrounded, computed in float32): |Δ| of each side's prompt logprobs\n\n")
		fmt.Println("| weights | pdserve: max abs Δ | pdserve: mean abs Δ | llama.cpp: max abs Δ | llama.cpp: mean abs Δ |")
		fmt.Println("|---|---|---|---|---|")
		for _, ft := range files {
			pd, ll := pds[ft], lls[ft]
			pmax, pmean := diffStats(seqs, func(i, j int) float64 { return float64(pd[i][j-1].Token.Logprob) }, refLP)
			lmax, lmean := diffStats(seqs, func(i, j int) float64 { return ll.Seqs[i].Logprobs[j-1] }, refLP)
			fmt.Printf("| %s | %.2e | %.1e | %.2e | %.1e |\n", ft, pmax, pmean, lmax, lmean)
		}
	}
	return ok
}

// diffStats is the largest and the mean |a − b| over every scored
// position j ≥ 1 of every sequence i of seqs.
func diffStats(seqs [][]int32, a, b func(i, j int) float64) (maxDiff, mean float64) {
	var sum float64
	var n int
	for i, s := range seqs {
		for j := 1; j < len(s); j++ {
			d := math.Abs(a(i, j) - b(i, j))
			maxDiff = max(maxDiff, d)
			sum += d
			n++
		}
	}
	return maxDiff, sum / float64(n)
}
