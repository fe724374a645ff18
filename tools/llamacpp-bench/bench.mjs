// Times llama.cpp (through node-llama-cpp, prebuilt CPU binaries, offline)
// on a GGUF file, the way pdserve's BenchmarkSmolLM2 times pdserve, or
// checks its next-token probabilities against pdserve's. Run by the Go
// driver in this directory (see README.md); prints one JSON object.
//
//   node bench.mjs perf   --model m.gguf --threads 2 [--decode 64] [--batch 16] [--prefill 512] [--prefill-runs 3]
//   node bench.mjs verify --model m.gguf --threads 2 --ref ref.json
//   node bench.mjs refs   --model m.gguf --threads 2 --seqs seqs.json [--greedy 32]
//   node bench.mjs score  --model m.gguf --threads 2 --seqs seqs.json [--chunk 64] [--top 5]
//
// perf measures, with a --kv KV cache (F32 unless given) and flash attention off (each also as
// CPU milliseconds per token, *_cpu_ms_tok: the process's user + system
// time over the timed part, which counts llama.cpp's threads spinning at
// its barriers too):
//   prefill: a 512-token prompt evaluated from position 0 (one batch), tokens/s;
//   decode1: one sequence with 128 tokens of context, greedy steps, tokens/s;
//   decode16: 16 sequences with 128 tokens each, stepped in lockstep (every
//             sequence's next token issued together, so llama.cpp batches them),
//             generated tokens/s over all sequences.
// refs, for each token sequence of seqs.json (a JSON list of id lists): the
// full next-token probability vector after the sequence, and the greedy
// continuation with the smallest top-1/top-2 log-probability gap along it.
// score, for each token sequence of seqs.json: the prompt logprobs (vLLM's
// prompt_logprobs), i.e. at every position j ≥ 1 the natural log of the
// probability of token j given tokens 0…j-1, and the top most likely ids
// there with theirs. The sequence is evaluated from position 0 in chunks of
// --chunk tokens (the context's batch size), asking for the probabilities
// after every token (greedy sampler: the model's raw distribution). The
// addon normalises them in float32 (expf, a float sum in descending order);
// each position is renormalised here in float64 (lp = ln p − ln Σp), and
// norm = ln Σp (the float32 normalisation's error) is reported with it.
// Run it with UV_THREADPOOL_SIZE=1 (see docs/performance.md ("The real model on CPU")).
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {readFileSync} from "node:fs";

const args = process.argv.slice(2);
const mode = args[0];
const opt = (name, def) => {
    const i = args.indexOf("--" + name);
    return i >= 0 ? args[i + 1] : def;
};
const modelPath = opt("model");
const threads = Number(opt("threads", "2"));
// The KV cache's element type, K and V (ggml's names: F32, F16, BF16).
const kvType = opt("kv", "F32");

// Deterministic token ids (xorshift32), avoiding the placeholder vocabulary's
// first 259 ids (special and byte tokens).
let state = 0x9e3779b9;
function rand() {
    state ^= state << 13; state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5; state >>>= 0;
    return state;
}

const llama = await getLlama({gpu: false, build: "never", maxThreads: threads, logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
// The vocabulary size under the file's architecture prefix (llama, qwen3, …).
const meta = model.fileInfo.metadata;
const nVocab = Number(meta[meta.general.architecture]?.vocab_size ?? 49152);
const randomTokens = (n) => Array.from({length: n}, () => 259 + (rand() % (nVocab - 259)));

// swaFullCache: a model with sliding-window layers (gemma2, gemma3) keeps
// every position's KV in those layers too, masked (llama.cpp's swa_full), as
// pdserve does. Without it llama.cpp keeps only the window there, and
// node-llama-cpp then takes checkpoints of the context state as it evaluates
// (LlamaContextSequence.needsCheckpoints), so that it can restore prefixes:
// time that is not the model's (on gemma3-shaped Q4_K_M, batch-1 decode
// was 1.5–2× faster with it, on a loaded machine). The masks, and so the
// results, are the same either way.
function ctxOptions(extra) {
    return {
        threads: {ideal: threads, min: threads},
        flashAttention: false,
        swaFullCache: true,
        experimentalKvCacheKeyType: kvType,
        experimentalKvCacheValueType: kvType,
        ...extra,
    };
}

const greedy = {temperature: 0};
const now = () => Number(process.hrtime.bigint()) / 1e9;
// CPU milliseconds (user + system, all threads of the process) since c0, a
// process.cpuUsage() reading.
const cpuMs = (c0) => {
    const c = process.cpuUsage(c0);
    return (c.user + c.system) / 1000;
};

if (mode === "perf") {
    const decodeSteps = Number(opt("decode", "64"));
    const batch = Number(opt("batch", "16"));
    const prefillLen = Number(opt("prefill", "512"));
    const prefillRuns = Number(opt("prefill-runs", "3"));
    const ctxLen = 128;
    const out = {threads, decodeSteps, batch, prefillLen};

    // Prefill: a fresh evaluation of prefillLen tokens from position 0.
    {
        const ctx = await model.createContext(ctxOptions({contextSize: 1024, batchSize: prefillLen, sequences: 1}));
        const seq = ctx.getSequence();
        const prompt = randomTokens(prefillLen);
        await seq.evaluateWithoutGeneratingNewTokens(prompt); // warm-up
        const times = [];
        let cpu = 0;
        for (let i = 0; i < prefillRuns; i++) {
            await seq.clearHistory();
            const c0 = process.cpuUsage();
            const t0 = now();
            await seq.evaluateWithoutGeneratingNewTokens(prompt);
            times.push(now() - t0);
            cpu += cpuMs(c0);
        }
        out.prefill_tok_s = prefillLen * prefillRuns / times.reduce((a, b) => a + b, 0);
        out.prefill_cpu_ms_tok = cpu / (prefillLen * prefillRuns);
        await ctx.dispose();
    }

    // Decode, batch 1: ctxLen tokens of context, then greedy steps.
    {
        const ctx = await model.createContext(ctxOptions({contextSize: 1024, batchSize: 512, sequences: 1}));
        const seq = ctx.getSequence();
        const res = await seq.controlledEvaluate(randomTokens(ctxLen).map((t, i) => i === ctxLen - 1 ? [t, {generateNext: {token: true, options: greedy}}] : t));
        let tok = res[ctxLen - 1].next.token;
        // one warm-up step
        tok = (await seq.controlledEvaluate([[tok, {generateNext: {token: true, options: greedy}}]]))[0].next.token;
        const c0 = process.cpuUsage();
        const t0 = now();
        for (let i = 0; i < decodeSteps; i++) {
            tok = (await seq.controlledEvaluate([[tok, {generateNext: {token: true, options: greedy}}]]))[0].next.token;
        }
        out.decode1_tok_s = decodeSteps / (now() - t0);
        out.decode1_cpu_ms_tok = cpuMs(c0) / decodeSteps;
        await ctx.dispose();
    }

    // Decode, batch 16, in lockstep.
    {
        const ctx = await model.createContext(ctxOptions({contextSize: batch * (ctxLen + decodeSteps + 8), batchSize: 512, sequences: batch}));
        const seqs = Array.from({length: batch}, () => ctx.getSequence());
        const step = async (toks) => (await Promise.all(seqs.map((s, i) =>
            s.controlledEvaluate([[toks[i], {generateNext: {token: true, options: greedy}}]])))).map((r) => r[0].next.token);
        let toks = (await Promise.all(seqs.map((s) => {
            const p = randomTokens(ctxLen);
            return s.controlledEvaluate(p.map((t, i) => i === ctxLen - 1 ? [t, {generateNext: {token: true, options: greedy}}] : t));
        }))).map((r) => r[ctxLen - 1].next.token);
        toks = await step(toks); // warm-up
        const c0 = process.cpuUsage();
        const t0 = now();
        for (let i = 0; i < decodeSteps; i++) toks = await step(toks);
        out.decode16_tok_s = batch * decodeSteps / (now() - t0);
        out.decode16_cpu_ms_tok = cpuMs(c0) / (batch * decodeSteps);
        await ctx.dispose();
    }
    console.log(JSON.stringify(out));
} else if (mode === "verify") {
    // ref.json (written by the Go driver from pdserve with a KV cache of the same dtype):
    // {prompt: [ids], top: [[id, prob], ...] after the prompt, greedy: [ids]}.
    const ref = JSON.parse(readFileSync(opt("ref"), "utf8"));
    const ctx = await model.createContext(ctxOptions({contextSize: 256, batchSize: 256, sequences: 1}));
    const seq = ctx.getSequence();
    const n = ref.prompt.length;
    const res = await seq.controlledEvaluate(ref.prompt.map((t, i) => i === n - 1 ? [t, {generateNext: {probabilities: true, token: true, options: greedy}}] : t));
    // The addon normalises the probabilities in float32, adding them in
    // descending order: after a dominant token, terms below half an ulp of
    // the running sum are lost (on a peaked distribution every probability
    // comes out ~Σ lost too high). Renormalise in float64, as score does;
    // sum is the addon's Σp.
    const probs = res[n - 1].next.probabilities;
    let sum = 0;
    for (const p of probs.values()) sum += p;
    const top = [...probs.entries()].slice(0, ref.top.length).map(([id, p]) => [id, p / sum]);
    let maxDiff = 0;
    for (const [id, p] of ref.top) maxDiff = Math.max(maxDiff, Math.abs((probs.get(id) ?? 0) / sum - p));
    const greedyToks = [res[n - 1].next.token];
    while (greedyToks.length < ref.greedy.length) {
        const r = await seq.controlledEvaluate([[greedyToks.at(-1), {generateNext: {token: true, options: greedy}}]]);
        greedyToks.push(r[0].next.token);
    }
    console.log(JSON.stringify({top, maxProbDiff: maxDiff, sum, greedy: greedyToks,
        greedyMatch: greedyToks.every((t, i) => t === ref.greedy[i]), top1Match: top[0][0] === ref.top[0][0]}));
    await ctx.dispose();
} else if (mode === "refs") {
    const seqs = JSON.parse(readFileSync(opt("seqs"), "utf8"));
    const nGreedy = Number(opt("greedy", "32"));
    const gen = {probabilities: true, token: true, options: greedy};
    const vec = (probs) => Array.from({length: nVocab}, (_, id) => probs.get(id) ?? 0);
    const gap = (p) => {
        const s = [...p].sort((a, b) => b - a);
        return Math.log(s[0]) - Math.log(s[1]);
    };
    const out = [];
    for (const toks of seqs) {
        const ctx = await model.createContext(ctxOptions({contextSize: 512, batchSize: 512, sequences: 1}));
        const seq = ctx.getSequence();
        const n = toks.length;
        const res = await seq.controlledEvaluate(toks.map((t, i) => i === n - 1 ? [t, {generateNext: gen}] : t));
        const last = vec(res[n - 1].next.probabilities);
        let minGap = gap(last);
        const cont = [res[n - 1].next.token];
        while (cont.length < nGreedy) {
            const r = await seq.controlledEvaluate([[cont.at(-1), {generateNext: gen}]]);
            minGap = Math.min(minGap, gap(vec(r[0].next.probabilities)));
            cont.push(r[0].next.token);
        }
        out.push({tokens: toks, last_position_probs: last.map((p) => Number(p.toPrecision(7))), greedy_continuation: cont,
            min_top1_top2_logprob_gap: Number(minGap.toPrecision(4))});
        await ctx.dispose();
    }
    console.log(JSON.stringify(out));
} else if (mode === "score") {
    const seqs = JSON.parse(readFileSync(opt("seqs"), "utf8"));
    const chunk = Number(opt("chunk", "64"));
    const nTop = Number(opt("top", "5"));
    const gen = {generateNext: {probabilities: true, options: greedy}};
    // One position: the target's logprob and the nTop most likely ids (ties
    // by lower id, as pdserve orders them), renormalised in float64.
    const position = (probs, target) => {
        let sum = 0;
        const top = []; // [id, p], most likely first
        for (const [id, p] of probs) {
            sum += p;
            if (top.length === nTop && !(p > top[nTop - 1][1] || (p === top[nTop - 1][1] && id < top[nTop - 1][0]))) continue;
            let i = top.length === nTop ? nTop - 1 : top.length;
            while (i > 0 && (top[i - 1][1] < p || (top[i - 1][1] === p && top[i - 1][0] > id))) i--;
            top.splice(i, 0, [id, p]);
            top.length = Math.min(top.length, nTop);
        }
        const norm = Math.log(sum);
        const pt = probs.get(target) ?? 0;
        if (!(pt > 0)) throw new Error(`token ${target}: probability ${pt}`);
        return {lp: Math.log(pt) - norm, norm, top: top.map(([id, p]) => [id, Math.log(p) - norm])};
    };
    const out = {threads, chunk, top: nTop, seqs: []};
    const t0 = now();
    for (const toks of seqs) {
        const n = toks.length;
        const ctx = await model.createContext(ctxOptions({contextSize: Math.max(256, Math.ceil((n + 1) / 256) * 256), batchSize: chunk, sequences: 1}));
        const seq = ctx.getSequence();
        const r = {n, logprobs: [], norm: [], top: []}; // entry j-1 for position j
        for (let s = 0; s < n; s += chunk) {
            const part = toks.slice(s, Math.min(n, s + chunk));
            const res = await seq.controlledEvaluate(part.map((t, i) => s + i + 1 < n ? [t, gen] : t));
            for (let i = 0; i < part.length && s + i + 1 < n; i++) {
                const p = position(res[i].next.probabilities, toks[s + i + 1]);
                r.logprobs.push(p.lp);
                r.norm.push(p.norm);
                r.top.push(p.top);
            }
        }
        out.seqs.push(r);
        await ctx.dispose();
    }
    out.seconds = now() - t0;
    console.log(JSON.stringify(out));
} else {
    console.error("usage: node bench.mjs perf|verify|refs|score --model m.gguf ...");
    process.exit(2);
}
await model.dispose();
await llama.dispose();
