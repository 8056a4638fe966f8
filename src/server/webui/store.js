// What the page keeps in the browser's localStorage: the conversations (each an id, a
// title and its messages) and the settings (system prompt, sampling). Replies being
// generated live in memory (app.js) and are saved as they finish.
'use strict';

const Store = (() => {
  const CONVERSATIONS = 'edge-llm.conversations';
  const ACTIVE = 'edge-llm.active';
  const SETTINGS = 'edge-llm.settings';

  const DEFAULT_SETTINGS = {
    system: '',
    temperature: 0.7,
    top_p: 0.95,
    max_tokens: 512,
    seed: null,
  };

  function read(key, fallback) {
    try {
      const raw = localStorage.getItem(key);
      return raw === null ? fallback : JSON.parse(raw);
    } catch (e) {
      return fallback;
    }
  }

  function write(key, value) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
    } catch (e) {
      console.warn('edge-llm: could not save to localStorage', e);
    }
  }

  const newId = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 8);

  // A message as it is kept: role, content, and for replies the figures shown under it.
  const cleanMessage = (m) => ({
    role: m.role === 'assistant' ? 'assistant' : 'user',
    content: typeof m.content === 'string' ? m.content : '',
    ...(m.stats ? { stats: m.stats } : {}),
    ...(m.error ? { error: String(m.error) } : {}),
  });

  function loadConversations() {
    const list = read(CONVERSATIONS, []);
    if (!Array.isArray(list)) return [];
    return list
      .filter((c) => c && typeof c.id === 'string' && Array.isArray(c.messages))
      .map((c) => ({
        id: c.id,
        title: typeof c.title === 'string' ? c.title : 'Chat',
        messages: c.messages.map(cleanMessage),
        updated: Number(c.updated) || 0,
      }));
  }

  return {
    newId,
    cleanMessage,
    loadConversations,
    saveConversations: (list) => write(CONVERSATIONS, list),
    loadActive: () => read(ACTIVE, null),
    saveActive: (id) => write(ACTIVE, id),
    loadSettings: () => ({ ...DEFAULT_SETTINGS, ...read(SETTINGS, {}) }),
    saveSettings: (s) => write(SETTINGS, s),
  };
})();
