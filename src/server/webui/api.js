// The page's calls to its own server: `/v1/models` (the model's name), `/metrics` (the
// engine panel) and streamed `/v1/chat/completions`. With `--api-key` every call carries
// `Authorization: Bearer KEY`; a 401 raises `AuthError` so the page can ask for the key.
// The key lives in sessionStorage, or localStorage when the user asks to remember it.
'use strict';

class AuthError extends Error {}

const Api = (() => {
  const KEY = 'edge-llm.api-key';
  let key = sessionStorage.getItem(KEY) || localStorage.getItem(KEY) || '';

  function setKey(value, remember) {
    key = value;
    sessionStorage.setItem(KEY, value);
    if (remember) localStorage.setItem(KEY, value);
    else localStorage.removeItem(KEY);
  }

  function forgetKey() {
    key = '';
    sessionStorage.removeItem(KEY);
    localStorage.removeItem(KEY);
  }

  function headers(extra) {
    const h = { ...(extra || {}) };
    if (key) h.Authorization = 'Bearer ' + key;
    return h;
  }

  // The server's error message from an OpenAI-style body, or the status line.
  async function failure(response) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) message = body.error.message;
    } catch (e) { /* not JSON */ }
    return response.status === 401 ? new AuthError(message) : new Error(message);
  }

  async function get(path) {
    const response = await fetch(path, { headers: headers(), cache: 'no-store' });
    if (!response.ok) throw await failure(response);
    return response;
  }

  async function models() {
    const body = await (await get('/v1/models')).json();
    return body.data || [];
  }

  // `/metrics` as a map from sample name (labels included) to number.
  // With several models, `model` names the one whose figures to read.
  async function metrics(model) {
    const text = await (await get(model ? `/metrics?model=${encodeURIComponent(model)}` : '/metrics')).text();
    const samples = new Map();
    for (const line of text.split('\n')) {
      if (!line || line.startsWith('#')) continue;
      const cut = line.lastIndexOf(' ');
      samples.set(line.slice(0, cut), Number(line.slice(cut + 1)));
    }
    return samples;
  }

  // Streams a chat completion: yields each parsed chunk; ends at `[DONE]`. `signal` aborts
  // the request, which makes the server abort the generation and free its blocks.
  async function* chatStream(body, signal) {
    const response = await fetch('/v1/chat/completions', {
      method: 'POST',
      headers: headers({ 'Content-Type': 'application/json' }),
      body: JSON.stringify(body),
      signal,
    });
    if (!response.ok) throw await failure(response);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf('\n\n')) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split('\n')) {
          if (!line.startsWith('data:')) continue;
          const data = line.slice(5).trim();
          if (data === '[DONE]') return;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message || 'generation failed');
          yield chunk;
        }
      }
    }
  }

  return { models, metrics, chatStream, setKey, forgetKey, hasKey: () => !!key };
})();
