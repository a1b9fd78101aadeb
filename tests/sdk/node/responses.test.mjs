// The Responses and Conversations APIs through the official Node SDK, with
// recall in front of the scripted chat upstream (which has no Responses
// API of its own). Each request sends only what is new.

import { describe, it, before, after, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

import { startStack } from './stack.mjs';

const MODEL = 'gpt-4o-mini';

describe('Responses API through recall, upstream: scripted', () => {
  let stack;
  let client;

  before(async () => {
    stack = await startStack('scripted');
    client = new OpenAI({ baseURL: `${stack.recallUrl}/v1`, apiKey: 'sk-sdk-test', maxRetries: 0 });
  });
  after(async () => {
    await stack?.stop();
  });
  beforeEach(async () => {
    await stack.reset();
  });

  it('chains responses by previous_response_id', async () => {
    const r1 = await client.responses.create({ model: MODEL, input: 'My name is Ada.' });
    assert.equal(r1.status, 'completed');
    assert.equal(r1.output_text, 'echo: My name is Ada.');
    const r2 = await client.responses.create({
      model: MODEL,
      input: 'What did I say first?',
      previous_response_id: r1.id,
    });
    assert.equal(r2.output_text, 'You first said: My name is Ada.');
    const sent = (await stack.received()).at(-1).messages;
    assert.deepEqual(sent.map((m) => m.role), ['system', 'user', 'assistant', 'user']);
    const got = await client.responses.retrieve(r2.id);
    assert.equal(got.output_text, r2.output_text);
  });

  it('streams through responses.stream and finalResponse()', async () => {
    const stream = client.responses.stream({ model: MODEL, input: 'slow please' });
    let text = '';
    for await (const event of stream) {
      if (event.type === 'response.output_text.delta') text += event.delta;
    }
    const final = await stream.finalResponse();
    assert.equal(final.status, 'completed');
    assert.equal(final.output_text, text);
    assert.ok(text.startsWith('slow reply: word0'), text);
  });

  it('keeps a conversation and lists its items', async () => {
    const conv = await client.conversations.create({
      items: [{ type: 'message', role: 'user', content: 'I am Grace.' }],
    });
    const r = await client.responses.create({ model: MODEL, input: 'What did I say first?', conversation: conv.id });
    assert.equal(r.output_text, 'You first said: I am Grace.');
    const items = [];
    for await (const item of client.conversations.items.list(conv.id, { order: 'asc' })) items.push(item);
    assert.deepEqual(items.map((i) => i.role), ['user', 'user', 'assistant']);
    assert.equal(items[2].id, r.output[0].id);
  });
});
