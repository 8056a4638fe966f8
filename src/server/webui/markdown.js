// A small Markdown renderer that builds DOM nodes, never HTML strings: every piece of
// model or user text enters the page through a text node (or `textContent`), so markup in
// a reply, such as <img src=x onerror=...>, shows as the characters it is.
//
// Blocks: fenced code (with a copy button; an unclosed fence, as while streaming, runs to the
// end), headings, block quotes, lists, rules, paragraphs. Inline: `code`, **strong**,
// *emphasis*, [links](https://...) and bare https:// links; only http(s) links become links.
'use strict';

const Markdown = (() => {
  const el = (tag, className, text) => {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  };

  const FENCE = /^\s{0,3}(```+|~~~+)\s*([\w.+#-]*)/;
  const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
  const QUOTE = /^\s{0,3}>\s?(.*)$/;
  const BULLET = /^\s{0,3}[-*+]\s+(.*)$/;
  const NUMBERED = /^\s{0,3}(\d{1,9})[.)]\s+(.*)$/;
  // Block quotes nest at most this deep; a deeper `>` shows as text. Each level renders its
  // body again, so 5,000 nested `>` once cost seconds per streamed frame (and 10,000 overflowed
  // the stack).
  const MAX_QUOTE_DEPTH = 32;

  // Copies `text`, with a fallback where the clipboard API is missing (plain http on a LAN
  // address is not a secure context).
  async function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      return;
    }
    const area = el('textarea');
    area.value = text;
    area.setAttribute('readonly', '');
    area.className = 'offscreen';
    document.body.appendChild(area);
    area.select();
    try { document.execCommand('copy'); } finally { area.remove(); }
  }

  // A button that copies what `getText` returns and says so for a moment.
  function copyButton(getText, label) {
    const button = el('button', 'copy', 'Copy');
    button.type = 'button';
    button.setAttribute('aria-label', label);
    button.addEventListener('click', async () => {
      try {
        await copyText(getText());
        button.textContent = 'Copied';
      } catch (e) {
        button.textContent = 'Copy failed';
      }
      setTimeout(() => { button.textContent = 'Copy'; }, 1500);
    });
    return button;
  }

  function codeBlock(code, lang) {
    const box = el('div', 'code-block');
    const head = el('div', 'code-head');
    head.appendChild(el('span', 'code-lang', lang || 'code'));
    head.appendChild(copyButton(() => code, 'Copy the code'));
    const pre = el('pre');
    const codeEl = el('code', null, code);
    if (lang) codeEl.dataset.lang = lang;
    pre.appendChild(codeEl);
    pre.tabIndex = 0; // a wide block scrolls with the keyboard
    box.append(head, pre);
    return box;
  }

  const INLINE = [
    { re: /`([^`\n]+)`/, make: (m) => el('code', null, m[1]) },
    { re: /\*\*(?=\S)([\s\S]*?\S)\*\*/, make: (m) => wrap('strong', m[1]) },
    // Underscores only at word edges, so snake_case and __dunder__ names stay text.
    { re: /(?<!\w)__(?=\S)([\s\S]*?\S)__(?!\w)/, make: (m) => wrap('strong', m[1]) },
    { re: /\*(?=[^\s*])([^*\n]*?[^\s*])\*/, make: (m) => wrap('em', m[1]) },
    { re: /\[([^\]\n]+)\]\(([^)\s]+)\)/, make: (m) => link(m[1], m[2]) },
    { re: /\bhttps?:\/\/[^\s<>()"']+[^\s<>()"'.,;:!?]/, make: (m) => link(m[0], m[0]) },
  ];

  function wrap(tag, text) {
    const node = el(tag);
    node.appendChild(inline(text));
    return node;
  }

  function link(text, href) {
    if (!/^https?:\/\//i.test(href)) return document.createTextNode(text);
    const a = el('a');
    a.href = href;
    a.rel = 'noopener noreferrer';
    a.target = '_blank';
    if (text === href) a.textContent = text;
    else a.appendChild(inline(text));
    return a;
  }

  // Inline spans of `text`: the earliest match of any pattern wins; text between is text.
  function inline(text) {
    const frag = document.createDocumentFragment();
    let rest = text;
    while (rest) {
      let best = null;
      for (const rule of INLINE) {
        const m = rule.re.exec(rest);
        if (m && (!best || m.index < best.m.index)) best = { m, rule };
      }
      if (!best) break;
      if (best.m.index > 0) frag.appendChild(document.createTextNode(rest.slice(0, best.m.index)));
      frag.appendChild(best.rule.make(best.m));
      rest = rest.slice(best.m.index + best.m[0].length);
    }
    if (rest) frag.appendChild(document.createTextNode(rest));
    return frag;
  }

  function list(lines, i, pattern, ordered) {
    const node = el(ordered ? 'ol' : 'ul');
    const first = pattern.exec(lines[i]);
    if (ordered && first[1] !== '1') node.start = parseInt(first[1], 10);
    let item = null;
    for (; i < lines.length; i++) {
      const m = pattern.exec(lines[i]);
      if (m) {
        item = el('li');
        item.appendChild(inline(ordered ? m[2] : m[1]));
        node.appendChild(item);
      } else if (item && /^\s{2,}\S/.test(lines[i])) {
        item.appendChild(document.createTextNode('\n'));
        item.appendChild(inline(lines[i].trim()));
      } else {
        break;
      }
    }
    return [node, i];
  }

  // The blocks of `text` as a fragment; `depth`: the block quotes it sits in.
  function render(text, depth = 0) {
    const isQuote = (line) => depth < MAX_QUOTE_DEPTH && QUOTE.test(line);
    const frag = document.createDocumentFragment();
    const lines = String(text).replace(/\r\n?/g, '\n').split('\n');
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if (!line.trim()) { i++; continue; }
      if ((m = FENCE.exec(line))) {
        const fence = m[1];
        const body = [];
        for (i++; i < lines.length && !lines[i].trim().startsWith(fence); i++) body.push(lines[i]);
        i++;
        frag.appendChild(codeBlock(body.join('\n'), m[2]));
      } else if ((m = HEADING.exec(line))) {
        frag.appendChild(wrap('h' + Math.min(6, m[1].length + 2), m[2]));
        i++;
      } else if (RULE.test(line)) {
        frag.appendChild(el('hr'));
        i++;
      } else if (isQuote(line)) {
        const body = [];
        for (; i < lines.length && (m = QUOTE.exec(lines[i])); i++) body.push(m[1]);
        const quote = el('blockquote');
        quote.appendChild(render(body.join('\n'), depth + 1));
        frag.appendChild(quote);
      } else if (BULLET.test(line)) {
        let node;
        [node, i] = list(lines, i, BULLET, false);
        frag.appendChild(node);
      } else if (NUMBERED.test(line)) {
        let node;
        [node, i] = list(lines, i, NUMBERED, true);
        frag.appendChild(node);
      } else {
        const body = [];
        for (; i < lines.length && lines[i].trim() && !FENCE.test(lines[i]) && !HEADING.test(lines[i])
          && !BULLET.test(lines[i]) && !NUMBERED.test(lines[i]) && !isQuote(lines[i]); i++) {
          body.push(lines[i]);
        }
        frag.appendChild(wrap('p', body.join('\n')));
      }
    }
    return frag;
  }

  return { render, copyButton, copyText };
})();
