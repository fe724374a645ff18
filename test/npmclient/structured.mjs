// structured.mjs drives a pdserve router with the official openai npm
// client's structured-output helpers — zodResponseFormat with
// chat.completions.parse and chat.completions.stream — and prints, as one
// JSON object on stdout, what the client made of each answer.
// structured_test.go runs it (`node structured.mjs http://127.0.0.1:PORT/v1`)
// and judges the output; this script only sends the requests and records.
//
// The schema bounds every field (enums, integers with a range, strings and
// arrays with a maximum length), so that even the simulated model's random
// tokens, drawn within the grammar's mask, finish the object well before
// max_tokens. A request that fails unexpectedly ends the script with exit
// status 1 and the request, the status and the body on stderr.
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';

const baseURL = process.argv[2];
if (!baseURL) {
  console.error('usage: node structured.mjs BASE_URL (e.g. http://127.0.0.1:8000/v1)');
  process.exit(2);
}

const client = new OpenAI({ baseURL, apiKey: 'pdserve-test', maxRetries: 0, timeout: 60_000 });

// Event is what the answer must hold: six fields of four kinds.
const Event = z.object({
  name: z.string().max(12),
  kind: z.enum(['meeting', 'call', 'review']),
  day: z.number().int().min(1).max(31),
  hours: z.number().int().min(0).max(9),
  remote: z.boolean(),
  tags: z.array(z.enum(['red', 'green', 'blue'])).max(3),
});

// A pattern with a lookbehind, which the engine refuses: the request must
// fail with 400 naming the field and the feature, not be ignored.
const Refused = z.object({
  code: z.string().regex(/(?<=x)y/),
});

const messages = [
  { role: 'system', content: 'Extract the event.' },
  { role: 'user', content: 'Design review with the red team on the 14th, two hours, in person.' },
];

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
    console.error(`structured.mjs: ${name} failed: ${JSON.stringify(detail)}`);
    if (err?.stack) console.error(err.stack);
    process.exit(1);
  }
}

// check reports whether value is an Event, and why not.
function check(value) {
  const r = Event.safeParse(value);
  return r.success ? null : r.error.message;
}

const models = await step('models.list', {}, () => client.models.list());
const model = models.data[0].id;

const parseReq = {
  model,
  messages,
  response_format: zodResponseFormat(Event, 'event'),
  seed: 77,
  max_tokens: 400,
};
const parsed = await step('chat.completions.parse', parseReq, () => client.chat.completions.parse(parseReq));
const choice = parsed.choices[0];

// The same request streamed: the client's stream parses the final content
// (and each delta's partial JSON) with the zod type.
let deltas = 0;
let partials = 0;
let done = null;
const streamReq = { ...parseReq };
const final = await step('chat.completions.stream', streamReq, async () => {
  const stream = client.chat.completions.stream(streamReq);
  stream.on('content.delta', (ev) => {
    deltas++;
    if (ev.parsed !== null && ev.parsed !== undefined) partials++;
  });
  stream.on('content.done', (ev) => {
    done = { content: ev.content, parsed: ev.parsed };
  });
  return await stream.finalChatCompletion();
});
const fchoice = final.choices[0];

// The refused schema: the client raises BadRequestError.
const refusedReq = { model, messages, response_format: zodResponseFormat(Refused, 'refused'), max_tokens: 16 };
let refusal = null;
try {
  await client.chat.completions.parse(refusedReq);
} catch (err) {
  refusal = {
    class: err?.constructor?.name ?? null,
    is_bad_request: err instanceof OpenAI.BadRequestError,
    status: err?.status ?? null,
    param: err?.param ?? null,
    code: err?.code ?? null,
    message: err?.error?.message ?? String(err),
  };
}

console.log(
  JSON.stringify({
    model,
    schema: parseReq.response_format.json_schema.schema,
    parse: {
      finish_reason: choice.finish_reason,
      content: choice.message.content,
      parsed: choice.message.parsed,
      parsed_type: typeof choice.message.parsed,
      refusal: choice.message.refusal ?? null,
      zod_error: check(choice.message.parsed),
    },
    stream: {
      deltas,
      partials,
      done,
      finish_reason: fchoice.finish_reason,
      content: fchoice.message.content,
      parsed: fchoice.message.parsed,
      zod_error: check(fchoice.message.parsed),
    },
    refused_schema: refusedReq.response_format.json_schema.schema,
    refusal,
  }),
);
