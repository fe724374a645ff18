// tools.mjs drives a pdserve router's tool calling with the official openai
// npm client and prints, as one JSON object on stdout, what the client
// parsed: a call forced with tool_choice "required" (created, and streamed
// through the client's stream helper, which assembles tool_calls deltas),
// a call of a named strict function read with chat.completions.parse
// (parsed_arguments), and the round trip's answer once the assistant's
// call and the tool's result are sent back. tools_test.go runs it
// (`node tools.mjs http://127.0.0.1:PORT/v1`) and judges the output.
import OpenAI from 'openai';

const baseURL = process.argv[2];
if (!baseURL) {
  console.error('usage: node tools.mjs BASE_URL (e.g. http://127.0.0.1:8000/v1)');
  process.exit(2);
}

const client = new OpenAI({ baseURL, apiKey: 'pdserve-test', maxRetries: 0, timeout: 60_000 });

// step runs one request, reporting it and what failed if it throws.
async function step(name, req, fn) {
  try {
    return await fn();
  } catch (err) {
    const detail = { step: name, request: req, error: String(err), status: err?.status ?? null, body: err?.error ?? null };
    console.error(`tools.mjs: ${name} failed: ${JSON.stringify(detail)}`);
    if (err?.stack) console.error(err.stack);
    process.exit(1);
  }
}

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The weather in a city',
      strict: true,
      parameters: {
        type: 'object',
        properties: { city: { type: 'string', maxLength: 10 }, unit: { type: 'string', enum: ['c', 'f'] } },
        required: ['city', 'unit'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'get_time',
      strict: true,
      parameters: {
        type: 'object',
        properties: { zone: { type: 'string', enum: ['utc', 'cet'] } },
        required: ['zone'],
        additionalProperties: false,
      },
    },
  },
];

const models = await step('models.list', {}, () => client.models.list());
const model = models.data[0].id;

const messages = [{ role: 'user', content: 'What is the weather in Oslo?' }];
const callReq = { model, messages, tools, tool_choice: 'required', parallel_tool_calls: false, seed: 11, max_tokens: 200 };
const call = await step('call', callReq, () => client.chat.completions.create(callReq));
const streamed = await step('call streamed', callReq, async () => {
  const stream = client.chat.completions.stream({ ...callReq, stream: true });
  return await stream.finalChatCompletion();
});

const namedReq = { model, messages, tools, tool_choice: { type: 'function', function: { name: 'get_time' } }, seed: 12, max_tokens: 200 };
const parsed = await step('parse', namedReq, () => client.chat.completions.parse(namedReq));

// The round trip: the assistant's call goes back with the tool's result.
const assistant = call.choices[0].message;
const results = (assistant.tool_calls ?? []).map((c) => ({
  role: 'tool',
  tool_call_id: c.id,
  content: JSON.stringify({ temperature: -3, unit: 'c' }),
}));
const answerReq = { model, messages: [...messages, assistant, ...results], tools, seed: 13, max_tokens: 8, ignore_eos: true };
const answer = await step('answer', answerReq, () => client.chat.completions.create(answerReq));

console.log(JSON.stringify({ tools, call, streamed, parsed, answer, answer_request: answerReq }));
