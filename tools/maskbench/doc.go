// Command maskbench runs MaskBench — the 11,306 JSON Schemas of
// guidance-ai/jsonschemabench's maskbench/data, each with valid and invalid
// instances — through internal/grammar with the Llama 3 tokenizer, and
// reports coverage (by split), errors, compile time and mask time.
//
// # Usage
//
//	go run ./tools/maskbench -data DIR [-json out.json] [-failures fail.jsonl]
//	    [-summary reasons.txt] [-expected expected_maskbench.json]
//	    [-schemas REGEXP] [-limit N] [-sample N] [-parallel N] [-timeout 1m]
//	    [-compact] [-flexible=false] [-isolate=false] [-tokenizer DIR]
//
// Run it from the repository root (the default -tokenizer is the Llama 3
// fixture internal/model/tokenizer/testdata/llama3, whose gzipped files it
// decompresses to a temporary directory). -parallel N runs N schemas at a
// time for a quicker coverage run; its mask times are then not comparable
// (the report says so), and published timings come from -parallel 1.
// GOMAXPROCS is whatever the environment gives; the report prints it.
//
// # Getting the data
//
// The data is not in this repository. With a clone or mirror of
// github.com/guidance-ai/jsonschemabench:
//
//	git -C jsonschemabench archive HEAD maskbench/data | tar -x -C /tmp/jsb
//	go run ./tools/maskbench -data /tmp/jsb/maskbench/data
//
// A partial snapshot that lacks some blobs (one fetched in December 2026
// lacked JsonSchemaStore---cloudformation.schema.json) makes git archive
// fail; take the files one by one instead, skipping the missing ones:
//
//	mkdir -p /tmp/jsb/maskbench/data
//	git -C jsonschemabench ls-tree -r HEAD maskbench/data | while read -r _ _ h p; do
//	    git -C jsonschemabench cat-file blob "$h" > "/tmp/jsb/$p" || rm -f "/tmp/jsb/$p"
//	done
//
// llguidance's per-schema results (-expected) are
// json_stats/expected_maskbench.json of github.com/guidance-ai/llguidance
// (git show HEAD:json_stats/expected_maskbench.json in a clone).
//
// # Methodology
//
// MaskBench has two runners, and this tool follows them where they agree
// and the stricter one where they differ:
//
//   - jsonschemabench's maskbench/maskbench/runner.py produced the published
//     table (llguidance 0.7.10: 8,909 of 11,306 passing, 20 validation
//     errors, 0 invalidation errors; XGrammar 8,122).
//   - llguidance's json_stats (json_stats/src/json_stats.rs, run by its CI
//     with expected_maskbench.json, which records 9,489 passing for later
//     versions).
//
// A file is a JSON object with "schema", "meta" and "tests"; each test has
// "data" (the instance) and "valid". 1,510 of the schemas have no tests:
// they pass if they compile.
//
// Serialization. runner.py tokenizes json.dumps(data, indent=None,
// ensure_ascii=False) after json.loads: keys in the file's order, ", "
// between items and ": " after keys, non-ASCII characters as themselves,
// control characters escaped. json_stats uses serde_json::to_string
// (preserve_order): the same without the spaces. Both compile the schema
// with flexible whitespace (llguidance's default), so both texts are
// allowed. This tool writes json.dumps's form by default (-compact for
// serde_json's) and compiles with grammar.Spec.FlexibleWhitespace (-flexible,
// on by default; -compact -flexible=false checks the compact grammar that
// the API uses by default). Numbers are written as Python writes them back:
// integers as in the file, other numbers in repr form.
//
// Tokenization. The text is encoded without BOS or other added tokens (the
// runners use Llama 3.1 8B Instruct's tokenizer, add_special_tokens=False).
//
// Per token. For each token of an instance: compute the mask (timed), check
// the token's bit, and consume the token. A masked-out token ends the
// instance: refused. After the last token, the instance is accepted iff the
// matcher may end there (llguidance's is_accepting; here CanEnd, and the
// EOS bit of one more mask is checked to agree with it). runner.py does not
// check the end, so an invalid instance that is a prefix of a valid text
// counts against an engine there and not here; json_stats checks it.
//
// Classes. A schema that grammar.Compile or grammar.NewConstraint refuses
// is compile-refused, tallied by the *grammar.Error's Keyword. A compiled
// schema passes iff every valid instance is accepted and every invalid one
// refused. Otherwise it is an invalidation error if some invalid instance
// was accepted, else "inconsistent" if FillMask and Accept disagreed on a
// token (or the EOS bit and CanEnd at the end: an engine bug, which the
// runners cannot see), else a validation error (a valid instance refused).
// The runners take the class from the first failing instance; taking the
// worst can only move schemas from validation to invalidation errors. A
// panic, a schema over its time budget
// (-timeout, 1 minute; runner.py gives 15) and a child process that dies
// (stack overflow, out of memory) are counted as panic, timeout and crash,
// and never end the run (-isolate, on by default, runs schemas in child
// processes of this program).
//
// Timing. Mask time is FillMask alone, as json_stats times compute_mask;
// mask+accept adds Accept, as runner.py times compute_mask and
// commit_token together (plus its Python overhead). Every token fed counts,
// the refused one included; the extra mask after the last token does not.
// Compile time is grammar.Compile plus grammar.NewConstraint (runner.py's
// compile_grammar builds llguidance's LLMatcher, its grammar and lexer;
// json_stats's TTFM adds the first mask). Percentiles are the sorted
// sample's element at ⌊n·p/100⌋, as maskbench_results.py takes them, over
// all tokens of all schemas of the run. llguidance 0.7.10's published mask
// times: p50 46 µs, p99 533 µs; compile p50 1,037 µs (TTFM).
//
// Splits are the file name's prefix before "---" (Github_easy, Kubernetes,
// Glaiveai2K, ...), else before the first "_" (BFCL, JME).
//
// Outputs: a table on stdout; -json the report; -failures every schema not
// passed as a JSON line (class, compile error, and per failed instance its
// index, the token position and the text around it); -summary the failure
// reasons grouped, most frequent first, with examples, and with -expected
// how many of each group llguidance passes.
package main
