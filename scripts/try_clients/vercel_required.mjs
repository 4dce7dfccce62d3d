// The Vercel AI SDK with toolChoice 'required' against rlgate, on Chat Completions,
// Responses and Anthropic Messages. Usage: node vercel_required.mjs BASE KEY
// (run from a folder where `ai`, `@ai-sdk/openai`, `@ai-sdk/anthropic` and `zod` are installed)
import { generateText, tool } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createAnthropic } from '@ai-sdk/anthropic';
import { z } from 'zod';

const [base, key] = process.argv.slice(2);
const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: key });
const anthropic = createAnthropic({ baseURL: `${base}/v1`, apiKey: key });
const weather = tool({
  description: 'The weather in a city.',
  inputSchema: z.object({ city: z.string() }),
  execute: async ({ city }) => `It is sunny in ${city}.`,
});
for (const [name, model] of [['chat', openai.chat('rlgate-policy')],
                             ['responses', openai.responses('rlgate-policy')],
                             ['anthropic', anthropic('claude-sonnet-4-6')]]) {
  const r = await generateText({ model, tools: { weather }, toolChoice: 'required',
    maxOutputTokens: 96, temperature: 0, prompt: 'What is the weather in Paris?' });
  if (!r.toolCalls.length) throw new Error(`${name}: no tool call: ${r.text}`);
  console.log(name, JSON.stringify(r.toolCalls[0].input));
}
