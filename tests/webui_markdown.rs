//! The chat page's Markdown renderer (src/server/webui/markdown.js) run under `node` with a
//! minimal DOM: no browser needed. Skips without `node` (fails under CI, see
//! `support::skip_or_fail`).

mod support;

use std::process::Command;

/// Loads markdown.js into a context with a minimal `document` (the few DOM calls it makes), then runs `body` (which sees
/// `Markdown`); the script's stdout, or a panic with its stderr.
fn run_node(body: &str) -> Option<String> {
    let path = support::root().join("src/server/webui/markdown.js");
    let script = format!(
        r#"
const fs = require('fs');
const vm = require('vm');
class Node {{
  constructor(tag) {{ this.tag = tag; this.children = []; this.text = ''; }}
  appendChild(c) {{ this.children.push(c); return c; }}
  addEventListener() {{}}
  set textContent(t) {{ this.text = String(t); }}
  get textContent() {{ return this.text + this.children.map((c) => c.textContent).join(''); }}
}}
const document = {{
  createElement: (tag) => new Node(tag),
  createDocumentFragment: () => new Node('#fragment'),
  createTextNode: (t) => {{ const n = new Node('#text'); n.text = String(t); return n; }},
}};
const ctx = vm.createContext({{ document, setTimeout, navigator: {{}} }});
vm.runInContext(fs.readFileSync({path:?}, 'utf8') + '\n;globalThis.Markdown = Markdown;', ctx);
const Markdown = ctx.Markdown;
function quoteDepth(n) {{
  let depth = 0;
  for (const c of n.children) depth = Math.max(depth, quoteDepth(c));
  return depth + (n.tag === 'blockquote' ? 1 : 0);
}}
{body}
"#
    );
    let out = match Command::new("node").arg("-e").arg(&script).output() {
        Ok(out) => out,
        Err(e) => {
            support::skip_or_fail(&format!("`node` cannot be run: {e}"));
            return None;
        }
    };
    assert!(
        out.status.success(),
        "node failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

/// Issue 30, item 9: the renderer recursed once per `>`, so 10,000 nested quotes threw and
/// 5,000 cost 1.6 s a frame while streaming. Quotes now nest at most 32 deep; the rest of the
/// `>`s show as text.
#[test]
fn ten_thousand_nested_quotes_render_quickly_capped_at_32_levels() {
    let Some(out) = run_node(
        r#"
const t = Date.now();
const frag = Markdown.render('>'.repeat(10000) + ' deep');
const ms = Date.now() - t;
const text = frag.textContent;
console.log(JSON.stringify({ depth: quoteDepth(frag), ms, deep: text.includes('deep'),
  shown: (text.match(/>/g) || []).length }));
console.log(JSON.stringify({ depth: quoteDepth(Markdown.render('> > a\n> b')) }));
"#,
    ) else {
        return;
    };
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let deep = &lines[0];
    assert_eq!(deep["depth"], 32, "{deep}");
    assert_eq!(deep["shown"], 10000 - 32, "{deep}");
    assert_eq!(deep["deep"], true, "{deep}");
    assert!(deep["ms"].as_u64().unwrap() < 500, "{deep}");
    assert_eq!(lines[1]["depth"], 2, "{}", lines[1]);
}
