//! One reply taken apart as it streams, the same way for every API: its `<think>` thoughts
//! (`reasoning::ReasoningSplitter`) and, in the rest, its tool calls
//! (`tool_parser::ToolCallParser`), as [`ReplyPiece`]s in the order they were written. The chat
//! completions stream turns them into `delta`s, the Responses API into `response.*` events, the
//! Messages API into content blocks. Fed the whole reply at once it gives the same pieces, so a
//! streamed reply always joins to the whole one.

use super::harmony::HarmonyParser;
use super::reasoning::{Piece, ReasoningSplitter};
use super::reply::ReplyParsing;
use super::tool_parser::{ToolCall, ToolCallParser, ToolEvent};

/// What a piece of a reply turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyPiece {
    /// Thoughts (inside `<think>`).
    Reasoning(String),
    /// Text for the user (never empty).
    Content(String),
    /// Call `index` opened, with this function name.
    CallStart { index: usize, name: String },
    /// More of call `index`'s arguments (raw JSON text).
    Arguments { index: usize, text: String },
}

/// The parsers of one reply.
#[derive(Clone, Debug)]
pub struct ReplyStream {
    splitter: Option<ReasoningSplitter>,
    parser: Option<ToolCallParser>,
    /// A harmony reply (gpt-oss): this one parser instead of the two above.
    harmony: Option<HarmonyParser>,
}

impl ReplyStream {
    pub fn new(parsing: &ReplyParsing) -> Self {
        if parsing.harmony {
            return ReplyStream {
                splitter: None,
                parser: None,
                harmony: Some(HarmonyParser::new()),
            };
        }
        ReplyStream {
            splitter: parsing.reasoning.map(ReasoningSplitter::new),
            parser: parsing
                .tool_calls
                .then(|| ToolCallParser::with_names(parsing.tool_names.clone())),
            harmony: None,
        }
    }

    /// Feeds the next piece of text (`end`: the reply's last); returns what it settles.
    pub fn push(&mut self, text: &str, end: bool) -> Vec<ReplyPiece> {
        if let Some(h) = self.harmony.as_mut() {
            let mut out = h.push(text);
            if end {
                out.extend(h.finish());
            }
            return out;
        }
        let pieces = match self.splitter.as_mut() {
            Some(splitter) => {
                let mut pieces = splitter.push(text);
                if end {
                    pieces.extend(splitter.finish());
                }
                pieces
            }
            None => vec![Piece::Content(text.to_string())],
        };
        let mut out = Vec::new();
        for piece in pieces {
            match (piece, self.parser.as_mut()) {
                (Piece::Reasoning(t), _) => out.push(ReplyPiece::Reasoning(t)),
                (Piece::Content(t), Some(p)) => out.extend(p.push(&t).into_iter().map(from_tool)),
                (Piece::Content(t), None) if !t.is_empty() => out.push(ReplyPiece::Content(t)),
                (Piece::Content(_), None) => {}
            }
        }
        if end {
            if let Some(p) = self.parser.as_mut() {
                out.extend(p.finish().into_iter().map(from_tool));
            }
        }
        out.retain(|p| !matches!(p, ReplyPiece::Content(t) if t.is_empty()));
        out
    }

    /// The calls found so far (none when calls are not looked for).
    pub fn calls(&self) -> &[ToolCall] {
        if let Some(h) = &self.harmony {
            return &h.calls;
        }
        self.parser.as_ref().map_or(&[], |p| &p.calls)
    }

    /// Calls whose start was given out but that the reply ended inside with arguments that are
    /// not whole JSON (left out of [`Self::calls`]).
    pub fn num_dropped(&self) -> usize {
        if let Some(h) = &self.harmony {
            return h.num_dropped;
        }
        self.parser.as_ref().map_or(0, |p| p.num_dropped)
    }
}

fn from_tool(e: ToolEvent) -> ReplyPiece {
    match e {
        ToolEvent::Content(t) => ReplyPiece::Content(t),
        ToolEvent::CallStart { index, name } => ReplyPiece::CallStart { index, name },
        ToolEvent::Arguments { index, text } => ReplyPiece::Arguments { index, text },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces_of(chunks: &[&str], parsing: &ReplyParsing) -> Vec<ReplyPiece> {
        let mut s = ReplyStream::new(parsing);
        let mut out = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            out.extend(s.push(c, i + 1 == chunks.len()));
        }
        out
    }

    #[test]
    fn thoughts_text_and_a_call_come_out_in_order() {
        let parsing = ReplyParsing {
            tool_calls: true,
            tool_names: Vec::new(),
            reasoning: Some(false),
            harmony: false,
        };
        let chunks = [
            "<think>hm",
            "m</think>\nLet me look.",
            "\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
        ];
        let pieces = pieces_of(&chunks, &parsing);
        assert_eq!(pieces[0], ReplyPiece::Reasoning("hm".into()));
        assert!(pieces.contains(&ReplyPiece::CallStart {
            index: 0,
            name: "f".into()
        }));
        let text: String = pieces
            .iter()
            .filter_map(|p| match p {
                ReplyPiece::Content(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(text, "Let me look.");
        let args: String = pieces
            .iter()
            .filter_map(|p| match p {
                ReplyPiece::Arguments { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(args, "{\"a\": 1}");
        assert_eq!(
            pieces_of(&[&chunks.concat()], &parsing),
            pieces_of(&chunks, &parsing).into_iter().fold(
                Vec::new(),
                |mut acc: Vec<ReplyPiece>, p| {
                    // Neighbouring pieces of one kind join to the whole reply's piece.
                    match (acc.last_mut(), p) {
                        (Some(ReplyPiece::Reasoning(a)), ReplyPiece::Reasoning(b)) => {
                            a.push_str(&b)
                        }
                        (Some(ReplyPiece::Content(a)), ReplyPiece::Content(b)) => a.push_str(&b),
                        (
                            Some(ReplyPiece::Arguments { text: a, .. }),
                            ReplyPiece::Arguments { text: b, .. },
                        ) => a.push_str(&b),
                        (_, p) => acc.push(p),
                    }
                    acc
                }
            )
        );
    }

    #[test]
    fn a_harmony_reply_streams_to_the_same_fields_as_the_whole() {
        use crate::api::reply::assistant_reply;
        let parsing = ReplyParsing {
            harmony: true,
            ..ReplyParsing::default()
        };
        let text = "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant\
                    <|channel|>commentary to=functions.lookup <|constrain|>json\
                    <|message|>{\"q\": \"MXFP4\"}<|call|>";
        let whole = assistant_reply(text, "chatcmpl-x", 0, &parsing);
        assert_eq!(whole.reasoning.as_deref(), Some("Look it up."));
        assert_eq!(whole.content, "");
        assert_eq!(whole.tool_calls.len(), 1);
        assert_eq!(whole.tool_calls[0]["function"]["name"], "lookup");
        assert_eq!(
            whole.tool_calls[0]["function"]["arguments"],
            "{\"q\": \"MXFP4\"}"
        );
        // Streamed in pieces of 5 bytes (at char boundaries): the same thoughts and arguments.
        let mut chunks = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let mut n = rest.len().min(5);
            while !rest.is_char_boundary(n) {
                n += 1;
            }
            chunks.push(&rest[..n]);
            rest = &rest[n..];
        }
        let mut s = ReplyStream::new(&parsing);
        let (mut thoughts, mut args) = (String::new(), String::new());
        for (i, c) in chunks.iter().enumerate() {
            for p in s.push(c, i + 1 == chunks.len()) {
                match p {
                    ReplyPiece::Reasoning(t) => thoughts.push_str(&t),
                    ReplyPiece::Arguments { text, .. } => args.push_str(&text),
                    ReplyPiece::Content(t) => panic!("content {t:?}"),
                    ReplyPiece::CallStart { name, .. } => assert_eq!(name, "lookup"),
                }
            }
        }
        assert_eq!(
            (thoughts.as_str(), args.as_str()),
            ("Look it up.", "{\"q\": \"MXFP4\"}")
        );
        assert_eq!(s.calls().len(), 1);
    }
}
