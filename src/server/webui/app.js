// The chat page: conversations (new, switch, rename, delete, fork), streaming replies with
// stop, regenerate and edit-and-resend, the settings, per-reply figures (tokens/s, time to
// first token, prompt tokens from the prefix cache) and the engine panel. Every text from
// the user or the model reaches the page through textContent or Markdown.render (DOM nodes).
'use strict';

(() => {
  const $ = (id) => document.getElementById(id);
  const el = (tag, className, text) => {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const button = (text, className, label, onClick) => {
    const b = el('button', className, text);
    b.type = 'button';
    if (label) b.setAttribute('aria-label', label);
    b.addEventListener('click', onClick);
    return b;
  };

  let conversations = Store.loadConversations();
  let activeId = Store.loadActive();
  let settings = Store.loadSettings();
  let modelId = '';
  // Whether the server has several models (then the picker chooses `modelId`).
  let severalModels = false;
  // Conversation id -> the reply being generated: { controller, message, started, firstAt, chunks }.
  const running = new Map();
  // Index of the message being edited in the active conversation, or -1.
  let editing = -1;

  const active = () => conversations.find((c) => c.id === activeId);
  const save = () => Store.saveConversations(conversations);

  function newConversation(title, messages) {
    const conv = { id: Store.newId(), title: title || 'New chat', messages: messages || [], updated: Date.now() };
    conversations.unshift(conv);
    save();
    return conv;
  }

  function select(id) {
    activeId = id;
    editing = -1;
    Store.saveActive(id);
    renderAll();
    closeDrawer();
  }

  // ---- Rendering ------------------------------------------------------------------------

  function renderList() {
    const list = $('conversation-list');
    list.replaceChildren();
    for (const conv of conversations) {
      const item = el('li', 'conv-item');
      item.dataset.id = conv.id;
      if (conv.id === activeId) item.classList.add('active');
      if (running.has(conv.id)) item.classList.add('generating');
      const open = button(conv.title, 'conv-open', null, () => select(conv.id));
      if (conv.id === activeId) open.setAttribute('aria-current', 'true');
      if (running.has(conv.id)) {
        const dot = el('span', 'dot');
        dot.setAttribute('role', 'status');
        dot.setAttribute('aria-label', 'generating');
        open.appendChild(dot);
      }
      const rename = button('\u270E', 'icon-button conv-rename', `Rename ${conv.title}`, () => startRename(conv, item));
      const del = button('\u2715', 'icon-button conv-delete', `Delete ${conv.title}`, () => remove(conv));
      item.append(open, rename, del);
      list.appendChild(item);
    }
  }

  function startRename(conv, item) {
    const input = el('input', 'rename-input');
    input.value = conv.title;
    input.setAttribute('aria-label', 'New name');
    let done = false;
    const finish = (keep) => {
      if (done) return;
      done = true;
      const title = input.value.trim();
      if (keep && title) { conv.title = title.slice(0, 120); save(); }
      renderAll();
      const again = document.querySelector(`.conv-item[data-id="${conv.id}"] .conv-open`);
      if (again) again.focus();
    };
    input.addEventListener('keydown', (e) => {
      if (e.key === 'Enter') { e.preventDefault(); finish(true); }
      if (e.key === 'Escape') { e.preventDefault(); finish(false); }
    });
    input.addEventListener('blur', () => finish(true));
    item.replaceChildren(input);
    input.focus();
    input.select();
  }

  function remove(conv) {
    if (!confirm(`Delete "${conv.title}"?`)) return;
    const run = running.get(conv.id);
    if (run) run.controller.abort();
    conversations = conversations.filter((c) => c.id !== conv.id);
    save();
    if (activeId === conv.id) {
      activeId = conversations.length ? conversations[0].id : newConversation().id;
      Store.saveActive(activeId);
    }
    renderAll();
    $('new-chat').focus();
  }

  function fmt(n, digits) {
    return Number.isFinite(n) ? n.toFixed(digits) : '\u2013';
  }

  // The figures under a reply: tokens/s, time to first token, cached prompt tokens.
  function statsLine(stats) {
    const line = el('div', 'stats');
    const add = (className, value, text, title) => {
      const span = el('span', className, text);
      span.dataset.value = String(value);
      if (title) span.title = title;
      line.appendChild(span);
    };
    if (stats.tokens_per_s !== undefined) {
      add('stat-tps', stats.tokens_per_s, `${fmt(stats.tokens_per_s, 1)} tok/s`,
        `${stats.completion_tokens} tokens after the first, ${stats.approx ? 'counted by the page' : 'as the server counted'}`);
    }
    if (stats.ttft_ms !== undefined) {
      add('stat-ttft', stats.ttft_ms, `TTFT ${fmt(stats.ttft_ms / 1000, 2)} s`, 'Time to first token, as the page saw it');
    }
    if (stats.cached_tokens !== undefined) {
      add('stat-cached', stats.cached_tokens, `${stats.cached_tokens} of ${stats.prompt_tokens} prompt tokens cached`,
        'Prompt tokens served from the prefix cache (usage.prompt_tokens_details.cached_tokens)');
    }
    if (stats.edited) add('stat-edited', 1, 'edited');
    if (stats.stopped) add('stat-stopped', 1, 'stopped');
    else if (stats.finish === 'length') add('stat-finish', stats.finish, 'max tokens reached');
    return line;
  }

  function renderMessage(conv, message, index) {
    const isUser = message.role === 'user';
    const article = el('article', `msg ${message.role}`);
    article.dataset.index = String(index);
    const run = running.get(conv.id);
    const streaming = run && run.message === message;
    if (streaming) article.classList.add('streaming');
    article.setAttribute('aria-label', isUser ? 'You' : 'Assistant');
    const head = el('div', 'msg-head');
    head.appendChild(el('span', 'role', isUser ? 'You' : 'Assistant'));
    article.appendChild(head);

    if (editing === index && !run) {
      article.appendChild(editor(conv, message, index));
      return article;
    }
    const body = el('div', 'msg-body');
    if (isUser) body.textContent = message.content;
    else body.appendChild(Markdown.render(message.content));
    if (streaming && !message.content) body.appendChild(el('span', 'typing', 'thinking\u2026'));
    article.appendChild(body);
    if (message.error) article.appendChild(el('p', 'error', message.error));
    if (!isUser && message.stats) article.appendChild(statsLine(message.stats));

    if (!streaming) {
      const actions = el('div', 'msg-actions');
      const busy = !!run;
      const who = isUser ? 'your message' : 'the reply';
      const edit = button('Edit', 'edit', `Edit ${who}`, () => { editing = index; renderMessages(); focusEditor(); });
      edit.disabled = busy;
      const fork = button('Fork', 'fork', `Fork the conversation at ${who}`, () => forkAt(conv, index));
      actions.append(edit, fork, Markdown.copyButton(() => message.content, `Copy ${who}`));
      if (!isUser && index === conv.messages.length - 1) {
        const regen = button('Regenerate', 'regenerate', 'Regenerate the reply', () => regenerate(conv));
        regen.disabled = busy;
        actions.appendChild(regen);
      }
      article.appendChild(actions);
    }
    return article;
  }

  function editor(conv, message, index) {
    const form = el('form', 'editor');
    const label = el('label', 'sr', 'Edit the message');
    const area = el('textarea', 'edit-area');
    area.id = 'edit-area';
    label.htmlFor = area.id;
    area.value = message.content;
    area.rows = Math.min(12, Math.max(3, message.content.split('\n').length + 1));
    const isUser = message.role === 'user';
    const ok = el('button', 'primary save-edit', isUser ? 'Save and send' : 'Save');
    ok.type = 'submit';
    const cancel = button('Cancel', 'cancel-edit', null, () => { editing = -1; renderMessages(); });
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      editing = -1;
      if (isUser) {
        const text = area.value.trim();
        if (!text) return;
        conv.messages = conv.messages.slice(0, index);
        conv.messages.push({ role: 'user', content: text });
        save();
        generate(conv);
      } else {
        message.content = area.value;
        message.stats = { edited: true };
        save();
        renderMessages();
      }
    });
    area.addEventListener('keydown', (e) => {
      if (e.key === 'Escape') { e.preventDefault(); editing = -1; renderMessages(); }
      if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); form.requestSubmit(); }
    });
    const row = el('div', 'editor-buttons');
    row.append(ok, cancel);
    form.append(label, area, row);
    return form;
  }

  function focusEditor() {
    const area = $('edit-area');
    if (area) area.focus();
  }

  function renderMessages() {
    const conv = active();
    const box = $('messages');
    const nearBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
    box.replaceChildren();
    if (!conv.messages.length) {
      const hint = el('div', 'empty');
      hint.appendChild(el('p', null, modelId ? `Chat with ${modelId}.` : 'Chat with the model.'));
      hint.appendChild(el('p', 'muted', 'Several conversations can generate at once on the one engine; a system prompt they share is computed once and then read from the prefix cache, and a fork reuses its conversation\u2019s cache.'));
      box.appendChild(hint);
    }
    conv.messages.forEach((m, i) => box.appendChild(renderMessage(conv, m, i)));
    if (nearBottom) box.scrollTop = box.scrollHeight;
    const isRunning = running.has(conv.id);
    // Screen readers wait for the reply to finish instead of reading every re-render.
    box.setAttribute('aria-busy', String(isRunning));
    $('stop').hidden = !isRunning;
    $('send').disabled = isRunning;
    $('conv-title').textContent = conv.title;
  }

  function renderAll() {
    if (!active()) {
      activeId = (conversations[0] || newConversation()).id;
      Store.saveActive(activeId);
    }
    renderList();
    renderMessages();
  }

  // Re-renders the reply being streamed (only it, so focus elsewhere stays put), at most
  // once a frame; the whole list if it is not on the page.
  let pending = false;
  function scheduleRender() {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      const conv = active();
      const run = running.get(conv.id);
      const box = $('messages');
      const node = box.querySelector('.msg.streaming');
      const index = run ? conv.messages.indexOf(run.message) : -1;
      if (!node || index < 0 || node.dataset.index !== String(index)) { renderMessages(); return; }
      const nearBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
      node.replaceWith(renderMessage(conv, run.message, index));
      if (nearBottom) box.scrollTop = box.scrollHeight;
    });
  }

  // ---- Generating ----------------------------------------------------------------------

  function requestBody(conv) {
    const messages = [];
    if (settings.system.trim()) messages.push({ role: 'system', content: settings.system });
    for (const m of conv.messages) messages.push({ role: m.role, content: m.content });
    const body = {
      model: modelId || undefined,
      messages,
      stream: true,
      stream_options: { include_usage: true },
      temperature: settings.temperature,
      top_p: settings.top_p,
      max_tokens: settings.max_tokens,
    };
    if (Number.isInteger(settings.seed)) body.seed = settings.seed;
    return body;
  }

  // Streams a reply to the conversation's last (user) message.
  async function generate(conv) {
    if (running.has(conv.id)) return;
    const message = { role: 'assistant', content: '' };
    const body = requestBody(conv);
    conv.messages.push(message);
    if (conv.title === 'New chat') {
      const first = conv.messages.find((m) => m.role === 'user');
      if (first) {
        const line = first.content.replace(/\s+/g, ' ').trim();
        conv.title = line.length > 48 ? `${line.slice(0, 47)}\u2026` : line;
      }
    }
    conv.updated = Date.now();
    const run = { controller: new AbortController(), message, started: performance.now(), firstAt: 0, chunks: 0 };
    running.set(conv.id, run);
    renderList();
    if (conv.id === activeId) renderMessages();
    let usage = null;
    let finish = null;
    try {
      for await (const chunk of Api.chatStream(body, run.controller.signal)) {
        if (chunk.usage) usage = chunk.usage;
        const choice = chunk.choices && chunk.choices[0];
        if (!choice) continue;
        if (choice.finish_reason) finish = choice.finish_reason;
        const text = choice.delta && choice.delta.content;
        if (text) {
          if (!run.firstAt) run.firstAt = performance.now();
          run.chunks++;
          message.content += text;
          if (conv.id === activeId) scheduleRender();
        }
      }
    } catch (e) {
      if (e.name !== 'AbortError') {
        message.error = e.message || String(e);
        if (e instanceof AuthError) askForKey(e.message);
      }
    }
    const end = performance.now();
    const stats = {};
    if (run.firstAt) stats.ttft_ms = Math.round(run.firstAt - run.started);
    const generated = usage ? usage.completion_tokens : run.chunks;
    if (run.firstAt && generated > 1 && end > run.firstAt) {
      stats.completion_tokens = generated;
      stats.tokens_per_s = Math.round(((generated - 1) / ((end - run.firstAt) / 1000)) * 10) / 10;
      if (!usage) stats.approx = true;
    }
    if (usage) {
      stats.prompt_tokens = usage.prompt_tokens;
      const details = usage.prompt_tokens_details || {};
      stats.cached_tokens = details.cached_tokens || 0;
    }
    if (run.controller.signal.aborted) stats.stopped = true;
    if (finish) stats.finish = finish;
    message.stats = stats;
    running.delete(conv.id);
    if (conversations.includes(conv)) save();
    renderList();
    if (conv.id === activeId) renderMessages();
    refreshEngine();
  }

  function send() {
    const conv = active();
    const input = $('input');
    const text = input.value.trim();
    if (!text || running.has(conv.id)) return;
    input.value = '';
    editing = -1;
    conv.messages.push({ role: 'user', content: text });
    save();
    generate(conv);
    const box = $('messages');
    box.scrollTop = box.scrollHeight;
  }

  function stop() {
    const run = running.get(activeId);
    if (run) run.controller.abort();
    $('input').focus();
  }

  function regenerate(conv) {
    if (running.has(conv.id)) return;
    const last = conv.messages[conv.messages.length - 1];
    if (last && last.role === 'assistant') conv.messages.pop();
    if (!conv.messages.length) return;
    save();
    generate(conv);
  }

  // A new conversation holding the messages before `index`; forking at a reply keeps the
  // reply, forking at your message puts its text in the box to change and send.
  function forkAt(conv, index) {
    const message = conv.messages[index];
    const keep = message.role === 'assistant' ? index + 1 : index;
    const copy = conv.messages.slice(0, keep).map((m) => Store.cleanMessage(JSON.parse(JSON.stringify(m))));
    const fork = newConversation(`${conv.title} (fork)`, copy);
    select(fork.id);
    if (message.role === 'user') $('input').value = message.content;
    $('input').focus();
  }

  // ---- Engine panel --------------------------------------------------------------------

  let engineTimer = 0;
  async function refreshEngine() {
    try {
      const m = await Api.metrics(severalModels ? modelId : '');
      const get = (name) => m.get(name);
      if (!m.has('edge_llm_kv_blocks_total')) {
        if (m.has('edge_llm_models_loaded')) {
          for (const id of ['engine-running', 'engine-waiting', 'engine-kv-used', 'engine-kv-cached', 'engine-kv-free', 'engine-hit-rate']) {
            $(id).textContent = '\u2013';
          }
          $('engine-state').textContent = '(not loaded)';
          return;
        }
        // A key that is not an admin key sees only its own counters, not the server's.
        for (const id of ['engine-running', 'engine-waiting', 'engine-kv-used', 'engine-kv-cached', 'engine-kv-free', 'engine-hit-rate']) {
          $(id).textContent = '\u2013';
        }
        $('engine-state').textContent = '(the server\u2019s figures need an admin key)';
        return;
      }
      const used = get('edge_llm_kv_blocks{state="used"}');
      const cached = get('edge_llm_kv_blocks{state="cached"}');
      const free = get('edge_llm_kv_blocks{state="free"}');
      const total = get('edge_llm_kv_blocks_total') || used + free;
      const rate = get('edge_llm_prefix_cache_hit_rate');
      $('engine-running').textContent = String(get('edge_llm_requests_running'));
      $('engine-waiting').textContent = String(get('edge_llm_requests_waiting'));
      $('engine-kv-used').textContent = `${used} of ${total}`;
      $('engine-kv-cached').textContent = String(cached);
      $('engine-kv-free').textContent = String(free);
      $('engine-hit-rate').textContent = Number.isFinite(rate) ? `${(rate * 100).toFixed(1)}%` : '\u2013';
      const bar = $('kv-bar');
      bar.querySelector('.kv-used').style.width = `${total ? (100 * used) / total : 0}%`;
      bar.querySelector('.kv-cached').style.width = `${total ? (100 * cached) / total : 0}%`;
      bar.setAttribute('aria-label', `KV blocks: ${used} used, ${cached} cached, ${free} free of ${total}`);
      $('engine-state').textContent = '';
    } catch (e) {
      $('engine-state').textContent = '(unavailable)';
      if (e instanceof AuthError) askForKey(e.message);
    }
  }

  // The panel polls every second, four times a second while a reply streams in this tab.
  let engineTick = 0;
  function startEngineTimer() {
    clearInterval(engineTimer);
    engineTimer = setInterval(() => {
      engineTick += 1;
      if (document.hidden) return;
      if (running.size > 0 || engineTick % 4 === 0) refreshEngine();
    }, 250);
    refreshEngine();
  }

  // ---- Model, API key ------------------------------------------------------------------

  async function connect() {
    try {
      const models = await Api.models();
      severalModels = models.length > 1;
      const ids = models.map((m) => m.id);
      const saved = localStorage.getItem('edge-llm.model');
      modelId = ids.includes(saved) ? saved : (ids[0] || '');
      $('model-name').textContent = modelId || 'no model';
      const picker = $('model-picker');
      if (severalModels) {
        picker.replaceChildren(...models.map((m) => {
          const option = el('option', null, m.status && m.status.failed ? `${m.id} (unavailable)` : m.id);
          option.value = m.id;
          option.disabled = !!(m.status && m.status.failed);
          return option;
        }));
        picker.value = modelId;
        picker.hidden = false;
        $('model-name').hidden = true;
      }
      if (models[0] && models[0].meta) {
        $('model-name').title = `${models[0].meta.architecture}, context ${models[0].meta.n_ctx} tokens`;
      }
      $('forget-key').hidden = !Api.hasKey();
      renderMessages();
      startEngineTimer();
      return true;
    } catch (e) {
      $('model-name').textContent = 'not connected';
      if (e instanceof AuthError) askForKey(Api.hasKey() ? e.message : '');
      else $('model-name').title = e.message;
      return false;
    }
  }

  function askForKey(message) {
    clearInterval(engineTimer);
    const dialog = $('key-dialog');
    $('key-error').textContent = message || '';
    if (!dialog.open) dialog.showModal();
    $('api-key').focus();
  }

  $('key-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const value = $('api-key').value.trim();
    if (!value) return;
    Api.setKey(value, $('remember-key').checked);
    $('key-error').textContent = 'Checking\u2026';
    if (await connect()) {
      $('key-error').textContent = '';
      $('key-dialog').close();
      $('input').focus();
    }
  });
  // Escape would leave the page without a key: keep the dialog until one works.
  $('key-dialog').addEventListener('cancel', (e) => e.preventDefault());

  $('forget-key').addEventListener('click', () => {
    Api.forgetKey();
    $('forget-key').hidden = true;
    connect();
  });

  // ---- Settings ------------------------------------------------------------------------

  const fields = [
    ['system', 'system', (v) => v],
    ['temperature', 'temperature', (v) => clampNumber(v, 0, 2, 0.7)],
    ['top-p', 'top_p', (v) => clampNumber(v, 0.01, 1, 0.95)],
    ['max-tokens', 'max_tokens', (v) => Math.round(clampNumber(v, 1, 1e9, 512))],
    ['seed', 'seed', (v) => (v.trim() === '' || !Number.isFinite(Number(v)) ? null : Math.trunc(Number(v)))],
  ];

  function clampNumber(v, lo, hi, fallback) {
    const n = Number(v);
    return v.trim() === '' || !Number.isFinite(n) ? fallback : Math.min(hi, Math.max(lo, n));
  }

  for (const [id, key, parse] of fields) {
    const input = $(id);
    input.value = settings[key] === null ? '' : String(settings[key]);
    const update = () => {
      settings = { ...settings, [key]: parse(input.value) };
      Store.saveSettings(settings);
    };
    input.addEventListener('input', update);
    input.addEventListener('change', update);
  }

  // ---- Layout and keys -----------------------------------------------------------------

  function toggle(buttonId, panelId, open) {
    const panel = $(panelId);
    const show = open === undefined ? panel.hidden || !panel.classList.contains('open') : open;
    if (panelId === 'settings') panel.hidden = !show;
    panel.classList.toggle('open', show);
    $(buttonId).setAttribute('aria-expanded', String(show));
    return show;
  }
  function closeDrawer() { toggle('menu-toggle', 'sidebar', false); }

  $('menu-toggle').addEventListener('click', () => {
    if (toggle('menu-toggle', 'sidebar')) $('new-chat').focus();
  });
  $('model-picker').addEventListener('change', () => {
    modelId = $('model-picker').value;
    localStorage.setItem('edge-llm.model', modelId);
    renderMessages();
    refreshEngine();
  });
  $('settings-toggle').addEventListener('click', () => {
    if (toggle('settings-toggle', 'settings')) $('system').focus();
  });
  $('settings-close').addEventListener('click', () => {
    toggle('settings-toggle', 'settings', false);
    $('settings-toggle').focus();
  });
  $('new-chat').addEventListener('click', () => {
    const empty = conversations.find((c) => !c.messages.length && !running.has(c.id));
    select((empty || newConversation()).id);
    $('input').focus();
  });
  $('composer').addEventListener('submit', (e) => { e.preventDefault(); send(); });
  $('stop').addEventListener('click', stop);
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  document.addEventListener('keydown', (e) => {
    if (e.key !== 'Escape' || $('key-dialog').open) return;
    if (running.has(activeId) && editing < 0) { stop(); return; }
    if ($('sidebar').classList.contains('open')) { closeDrawer(); $('menu-toggle').focus(); }
    if (!$('settings').hidden) { toggle('settings-toggle', 'settings', false); $('settings-toggle').focus(); }
  });
  // Another tab changed the conversations: take its copy unless this one is generating.
  window.addEventListener('storage', (e) => {
    if (e.key === 'edge-llm.conversations' && running.size === 0) {
      conversations = Store.loadConversations();
      renderAll();
    }
  });

  renderAll();
  connect();
})();
