//! The `output` of a Responses API reply, built from the pieces of the reply
//! (`api::reply_stream::ReplyPiece`) in the order they were written: `reasoning`, `message`
//! (`output_text`), `function_call` and `custom_tool_call` items, and the `response.*` events
//! that stream them in OpenAI's order (`output_item.added`, `content_part.added`, deltas,
//! `.done`s, `output_item.done`). A whole response feeds the whole reply and keeps only the
//! items, so a streamed response joins to the whole one. Called by `responses` and
//! `responses_stream`.

use serde_json::{json, Value};

use crate::api::reply_stream::ReplyPiece;

/// The item being written.
enum Open {
    Message {
        text: String,
    },
    Reasoning {
        text: String,
    },
    Call {
        call_id: String,
        name: String,
        arguments: String,
        custom: bool,
    },
}

/// The output items of one response, and the events not yet sent.
pub struct Output {
    /// The response's id (item and call ids derive from it).
    resp_id: String,
    /// Names of the `custom` tools.
    custom_tools: Vec<String>,
    pub items: Vec<Value>,
    open: Option<(String, Open)>,
    /// Events without their `sequence_number`.
    pub events: Vec<Value>,
    /// A `custom` tool the whole reply is the input of (`tool_choice` named it), and the text
    /// so far: the call is written when the reply ends.
    forced: Option<(String, String)>,
}

impl Output {
    pub fn new(resp_id: &str, custom_tools: Vec<String>) -> Self {
        Output {
            resp_id: resp_id.to_string(),
            custom_tools,
            items: Vec::new(),
            open: None,
            events: Vec::new(),
            forced: None,
        }
    }

    /// The whole reply is the input of custom tool `name` (see [`Self::forced`]).
    pub fn forcing(mut self, name: Option<String>) -> Self {
        self.forced = name.map(|n| (n, String::new()));
        self
    }

    fn item_id(&self, prefix: &str) -> String {
        let base = self.resp_id.trim_start_matches("resp_");
        format!("{prefix}_{base}_{}", self.items.len())
    }

    fn event(&mut self, kind: &str, fields: Value) {
        let mut e = json!({"type": kind});
        if let (Some(e), Value::Object(f)) = (e.as_object_mut(), fields) {
            e.extend(f);
        }
        self.events.push(e);
    }

    /// Takes the next pieces of the reply.
    pub fn push(&mut self, pieces: Vec<ReplyPiece>) {
        for piece in pieces {
            if let (Some((_, input)), ReplyPiece::Content(text)) = (self.forced.as_mut(), &piece) {
                input.push_str(text);
                continue;
            }
            match piece {
                ReplyPiece::Reasoning(text) => {
                    if !matches!(self.open, Some((_, Open::Reasoning { .. }))) {
                        self.end_item(false);
                        let id = self.item_id("rs");
                        let item =
                            json!({"type": "reasoning", "id": id, "summary": [], "content": []});
                        self.added(item);
                        self.event("response.content_part.added", json!({"item_id": id, "output_index": self.items.len(), "content_index": 0, "part": {"type": "reasoning_text", "text": ""}}));
                        self.open = Some((
                            id,
                            Open::Reasoning {
                                text: String::new(),
                            },
                        ));
                    }
                    let output_index = self.items.len();
                    if let Some((id, Open::Reasoning { text: all })) = self.open.as_mut() {
                        all.push_str(&text);
                        let id = id.clone();
                        self.event("response.reasoning_text.delta", json!({"item_id": id, "output_index": output_index, "content_index": 0, "delta": text}));
                    }
                }
                ReplyPiece::Content(text) => {
                    if !matches!(self.open, Some((_, Open::Message { .. }))) {
                        self.end_item(false);
                        let id = self.item_id("msg");
                        let item = json!({"type": "message", "id": id, "role": "assistant", "status": "in_progress", "content": []});
                        self.added(item);
                        self.event("response.content_part.added", json!({"item_id": id, "output_index": self.items.len(), "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}));
                        self.open = Some((
                            id,
                            Open::Message {
                                text: String::new(),
                            },
                        ));
                    }
                    let output_index = self.items.len();
                    if let Some((id, Open::Message { text: all })) = self.open.as_mut() {
                        all.push_str(&text);
                        let id = id.clone();
                        self.event("response.output_text.delta", json!({"item_id": id, "output_index": output_index, "content_index": 0, "delta": text, "logprobs": []}));
                    }
                }
                ReplyPiece::CallStart { index, name } => {
                    self.end_item(false);
                    let custom = self.custom_tools.contains(&name);
                    let base = self.resp_id.trim_start_matches("resp_");
                    let call_id = format!("call_{base}_{index}");
                    let id = self.item_id(if custom { "ctc" } else { "fc" });
                    let item = if custom {
                        json!({"type": "custom_tool_call", "id": id, "call_id": call_id, "name": name, "input": ""})
                    } else {
                        json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": "", "status": "in_progress"})
                    };
                    self.added(item);
                    self.open = Some((
                        id,
                        Open::Call {
                            call_id,
                            name,
                            arguments: String::new(),
                            custom,
                        },
                    ));
                }
                ReplyPiece::Arguments { text, .. } => {
                    let output_index = self.items.len();
                    if let Some((
                        id,
                        Open::Call {
                            arguments, custom, ..
                        },
                    )) = self.open.as_mut()
                    {
                        arguments.push_str(&text);
                        // A custom tool's input is a string inside the arguments: it goes out
                        // whole when the call ends.
                        if !*custom {
                            let id = id.clone();
                            self.event(
                                "response.function_call_arguments.delta",
                                json!({"item_id": id, "output_index": output_index, "delta": text}),
                            );
                        }
                    }
                }
            }
        }
    }

    fn added(&mut self, item: Value) {
        let output_index = self.items.len();
        self.event(
            "response.output_item.added",
            json!({"output_index": output_index, "item": item}),
        );
    }

    /// The reply has ended (`incomplete`: cut by `max_output_tokens`): writes a forced custom
    /// tool's call, then ends the item being written.
    pub fn close(&mut self, incomplete: bool) {
        if let Some((name, input)) = self.forced.take() {
            let arguments = json!({"input": input}).to_string();
            self.push(vec![
                ReplyPiece::CallStart { index: 0, name },
                ReplyPiece::Arguments {
                    index: 0,
                    text: arguments,
                },
            ]);
        }
        self.end_item(incomplete);
    }

    /// Ends the item being written (`incomplete`: the reply was cut by `max_output_tokens`).
    fn end_item(&mut self, incomplete: bool) {
        let Some((id, open)) = self.open.take() else {
            return;
        };
        let output_index = self.items.len();
        let status = if incomplete {
            "incomplete"
        } else {
            "completed"
        };
        let item = match open {
            Open::Message { text } => {
                self.event("response.output_text.done", json!({"item_id": id, "output_index": output_index, "content_index": 0, "text": text, "logprobs": []}));
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                self.event("response.content_part.done", json!({"item_id": id, "output_index": output_index, "content_index": 0, "part": part}));
                json!({"type": "message", "id": id, "role": "assistant", "status": status, "content": [part]})
            }
            Open::Reasoning { text } => {
                self.event("response.reasoning_text.done", json!({"item_id": id, "output_index": output_index, "content_index": 0, "text": text}));
                let part = json!({"type": "reasoning_text", "text": text});
                self.event("response.content_part.done", json!({"item_id": id, "output_index": output_index, "content_index": 0, "part": part}));
                json!({"type": "reasoning", "id": id, "summary": [], "content": [part], "status": status})
            }
            Open::Call {
                call_id,
                name,
                arguments,
                custom: true,
            } => {
                let input = serde_json::from_str::<Value>(&arguments)
                    .ok()
                    .and_then(|a| a.get("input").and_then(Value::as_str).map(String::from))
                    .unwrap_or(arguments);
                self.event(
                    "response.custom_tool_call_input.delta",
                    json!({"item_id": id, "output_index": output_index, "delta": input}),
                );
                self.event(
                    "response.custom_tool_call_input.done",
                    json!({"item_id": id, "output_index": output_index, "input": input}),
                );
                json!({"type": "custom_tool_call", "id": id, "call_id": call_id, "name": name, "input": input})
            }
            Open::Call {
                call_id,
                name,
                arguments,
                custom: false,
            } => {
                self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": output_index, "arguments": arguments}),
                );
                json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status})
            }
        };
        self.event(
            "response.output_item.done",
            json!({"output_index": output_index, "item": item}),
        );
        self.items.push(item);
    }

    /// The reply as chat messages, for the stored conversation: one assistant message with its
    /// text and its calls.
    pub fn assistant_messages(&self) -> Vec<Value> {
        let mut text = String::new();
        let mut calls = Vec::new();
        for item in &self.items {
            match item["type"].as_str() {
                Some("message") => {
                    text.push_str(item["content"][0]["text"].as_str().unwrap_or(""));
                }
                Some("function_call") => calls.push(json!({"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}})),
                Some("custom_tool_call") => calls.push(json!({"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": json!({"input": item["input"]}).to_string()}})),
                _ => {}
            }
        }
        let mut m = json!({"role": "assistant", "content": text});
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        vec![m]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_then_calls_make_items_and_events_in_order() {
        let mut out = Output::new("resp_ab", vec!["patch".into()]);
        out.push(vec![
            ReplyPiece::Content("Let me ".into()),
            ReplyPiece::Content("look.".into()),
            ReplyPiece::CallStart {
                index: 0,
                name: "f".into(),
            },
            ReplyPiece::Arguments {
                index: 0,
                text: "{\"a\": 1}".into(),
            },
            ReplyPiece::CallStart {
                index: 1,
                name: "patch".into(),
            },
            ReplyPiece::Arguments {
                index: 1,
                text: "{\"input\": \"*** x\"}".into(),
            },
        ]);
        out.close(false);
        let kinds: Vec<&str> = out
            .events
            .iter()
            .map(|e| e["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.custom_tool_call_input.delta",
                "response.custom_tool_call_input.done",
                "response.output_item.done",
            ]
        );
        assert_eq!(out.items[0]["content"][0]["text"], "Let me look.");
        assert_eq!(out.items[1]["arguments"], "{\"a\": 1}");
        assert_eq!(out.items[1]["call_id"], "call_ab_0");
        assert_eq!(out.items[2]["type"], "custom_tool_call");
        assert_eq!(out.items[2]["input"], "*** x");
        let m = &out.assistant_messages()[0];
        assert_eq!(m["content"], "Let me look.");
        assert_eq!(
            m["tool_calls"][1]["function"]["arguments"],
            "{\"input\":\"*** x\"}"
        );
        // Every event of an item carries its output index.
        assert!(out.events[8..11].iter().all(|e| e["output_index"] == 1));
    }
}
