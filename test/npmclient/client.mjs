// client.mjs drives a pdserve router with the official openai npm client and
// prints, as one JSON object on stdout, what the client parsed from each
// answer. client_test.go runs it (`node client.mjs http://127.0.0.1:PORT/v1`)
// and judges the output; this script only sends the requests and records.
//
// Every request has a seed, so a streamed request and the non-streamed one
// with the same fields must give the same choices. ignore_eos (a vLLM field
// the client passes through) makes every choice exactly max_tokens long.
// A request that fails ends the script with exit status 1 and the request,
// the status and the body the client saw on stderr.
import OpenAI from 'openai';

const baseURL = process.argv[2];
if (!baseURL) {
  console.error('usage: node client.mjs BASE_URL (e.g. http://127.0.0.1:8000/v1)');
  process.exit(2);
}

const client = new OpenAI({ baseURL, apiKey: 'pdserve-test', maxRetries: 0, timeout: 60_000 });

// The requests, by name; the streamed ones repeat a non-streamed one's fields.
const completionReq = {
  prompt: 'the quick brown fox',
  n: 2,
  logprobs: 2,
  seed: 1234,
  max_tokens: 8,
  ignore_eos: true,
};
const echoReq = {
  prompt: 'score this prompt, please',
  echo: true,
  logprobs: 1,
  max_tokens: 0,
};
const chatReq = {
  messages: [{ role: 'user', content: 'say something random' }],
  n: 2,
  logprobs: true,
  top_logprobs: 3,
  seed: 4321,
  max_tokens: 8,
  ignore_eos: true,
};

// step runs one request, reporting it and what failed if it throws.
async function step(name, req, fn) {
  try {
    return await fn();
  } catch (err) {
    const detail = {
      step: name,
      request: req,
      error: String(err),
      status: err?.status ?? null,
      body: err?.error ?? null,
    };
    console.error(`client.mjs: ${name} failed: ${JSON.stringify(detail)}`);
    if (err?.stack) console.error(err.stack);
    process.exit(1);
  }
}

// byIndex collects every streamed choice object under its index, in arrival
// order, and counts the chunks and how many choices each carried.
async function byIndex(stream) {
  const choices = {};
  const perChunk = [];
  for await (const chunk of stream) {
    perChunk.push(chunk.choices.length);
    for (const c of chunk.choices) {
      (choices[c.index] ??= []).push(c);
    }
  }
  return { choices, choices_per_chunk: perChunk };
}

const models = await step('models.list', {}, () => client.models.list());
const model = models.data[0].id;

const out = { model, requests: { completion: completionReq, echo: echoReq, chat: chatReq } };

out.completion = await step('completion', completionReq, () =>
  client.completions.create({ model, ...completionReq }),
);

out.echo = await step('echo', echoReq, () => client.completions.create({ model, ...echoReq }));

out.chat = await step('chat', chatReq, () => client.chat.completions.create({ model, ...chatReq }));

out.chat_stream = await step('chat_stream', { ...chatReq, stream: true }, async () =>
  byIndex(await client.chat.completions.create({ model, ...chatReq, stream: true })),
);

// The client's own accumulator (ChatCompletionStream) rebuilds the choices,
// their messages and their logprobs from the chunks, checking each chunk's
// shape as it goes; finalChatCompletion is what it made of them.
out.chat_stream_helper = await step('chat_stream_helper', { ...chatReq, stream: true }, async () => {
  const stream = client.chat.completions.stream({ model, ...chatReq });
  let chunks = 0;
  for await (const _ of stream) chunks++;
  return { chunks, final: await stream.finalChatCompletion() };
});

out.completion_stream = await step('completion_stream', { ...completionReq, stream: true }, async () =>
  byIndex(await client.completions.create({ model, ...completionReq, stream: true })),
);

process.stdout.write(JSON.stringify(out) + '\n');
