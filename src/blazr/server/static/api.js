// api.js — the chat page's calls to blazr's OpenAI API: /v1/models and streamed /v1/chat/completions.
//
// Every call carries `Authorization: Bearer <key>` when the page has a key; a 401 becomes an AuthError
// (the page then asks for the key and retries). The stream is read with fetch + ReadableStream and parsed
// as Server-Sent Events; each chunk's delta (content, reasoning_content, tool_calls) goes to `onDelta`,
// and the time to first token is measured here, around the fetch, with performance.now().

export class AuthError extends Error {}

export class ApiError extends Error {}

function headers(key) {
  const h = { "Content-Type": "application/json" };
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    message = body?.error?.message || body?.message || message;
  } catch {
    // not JSON: keep the status line
  }
  return response.status === 401 ? new AuthError(message) : new ApiError(message);
}

// The served models as [{id, state}]: state is a multi-model server's ("loaded", "sleeping", …), else null.
export async function listModels(key) {
  const response = await fetch("/v1/models", { headers: headers(key) });
  if (!response.ok) throw await failure(response);
  const body = await response.json();
  return (body.data || []).map((m) => ({ id: m.id, state: m.status?.value ?? null }));
}

// Split a growing SSE text buffer into complete events; returns [events' data strings, rest].
export function parseSse(buffer) {
  const events = [];
  const parts = buffer.split(/\r?\n\r?\n/);
  const rest = parts.pop();
  for (const part of parts) {
    const data = part
      .split(/\r?\n/)
      .filter((line) => line.startsWith("data:"))
      .map((line) => line.slice(5).replace(/^ /, ""));
    if (data.length) events.push(data.join("\n"));
  }
  return [events, rest];
}

// Merge one streamed tool-call delta list into `calls` (by index: id and name once, arguments appended).
function mergeToolCalls(calls, deltas) {
  for (const d of deltas) {
    const i = d.index ?? calls.length;
    const call = (calls[i] ||= { id: "", name: "", arguments: "" });
    if (d.id) call.id = d.id;
    if (d.function?.name) call.name += d.function.name;
    if (d.function?.arguments) call.arguments += d.function.arguments;
  }
}

// Stream one chat completion. `onUpdate(answer)` runs after every chunk with the answer so far:
// {content, reasoning, toolCalls, model, finishReason, usage, numChunks, ttftMs}. Resolves with the final
// answer plus its timings; an abort (Stop) resolves with what arrived and `stopped: true`.
export async function streamChat(body, { key, signal, onUpdate }) {
  const answer = {
    content: "", reasoning: "", toolCalls: [], model: body.model, finishReason: null, usage: null,
    numChunks: 0, ttftMs: null, totalMs: null, stopped: false,
  };
  const t0 = performance.now();
  let tFirst = null;
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(key),
      body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
      signal,
    });
    if (!response.ok) throw await failure(response);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      let events;
      [events, buffer] = parseSse(buffer + value);
      for (const data of events) {
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiError(chunk.error.message || "the stream failed");
        if (chunk.usage) answer.usage = chunk.usage;
        const choice = chunk.choices?.[0];
        if (!choice) continue;
        const delta = choice.delta || {};
        const reasoning = delta.reasoning_content ?? delta.reasoning ?? "";
        const hasToken = Boolean(delta.content || reasoning || delta.tool_calls?.length);
        if (hasToken) {
          if (tFirst === null) {
            tFirst = performance.now();
            answer.ttftMs = tFirst - t0;
          }
          answer.numChunks++;
        }
        answer.content += delta.content || "";
        answer.reasoning += reasoning;
        if (delta.tool_calls) mergeToolCalls(answer.toolCalls, delta.tool_calls);
        if (choice.finish_reason) answer.finishReason = choice.finish_reason;
        onUpdate?.(answer);
      }
    }
  } catch (err) {
    if (err.name !== "AbortError") throw err;
    answer.stopped = true;
  }
  const tEnd = performance.now();
  answer.totalMs = tEnd - t0;
  const numTokens = answer.usage?.completion_tokens ?? answer.numChunks;
  answer.numTokens = numTokens;
  // decode speed: the tokens after the first over the time after the first
  answer.tokPerS = tFirst !== null && numTokens > 1 && tEnd > tFirst ? ((numTokens - 1) * 1000) / (tEnd - tFirst) : null;
  return answer;
}
