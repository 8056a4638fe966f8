//! The tool-call parser's tests: Hermes calls, the forms written without markup, streamed
//! pieces joining to the whole reply.

use super::*;

const REPLY: &str = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"units\": {\"c\": true}}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

#[test]
fn whole_reply() {
    let (content, calls) = parse_all(REPLY, &[]);
    assert_eq!(content, "Let me check.");
    assert_eq!(
        calls,
        vec![
            ToolCall {
                name: "get_weather".into(),
                arguments: "{\"city\": \"Paris\", \"units\": {\"c\": true}}".into()
            },
            ToolCall {
                name: "get_time".into(),
                arguments: "{}".into()
            }
        ]
    );
}

#[test]
fn streamed_pieces_join_to_the_whole() {
    let whole = parse_all(REPLY, &[]);
    for step in 1..8 {
        let mut p = ToolCallParser::new();
        let mut events = Vec::new();
        let chars: Vec<char> = REPLY.chars().collect();
        for piece in chars.chunks(step) {
            events.extend(p.push(&piece.iter().collect::<String>()));
        }
        events.extend(p.finish());
        let mut content = String::new();
        let mut args = vec![String::new(); 2];
        let mut names = Vec::new();
        for e in events {
            match e {
                ToolEvent::Content(c) => content.push_str(&c),
                ToolEvent::CallStart { name, .. } => names.push(name),
                ToolEvent::Arguments { index, text } => args[index].push_str(&text),
            }
        }
        assert_eq!(content, whole.0, "step {step}");
        assert_eq!(names, vec!["get_weather", "get_time"]);
        assert_eq!(args[0], whole.1[0].arguments, "step {step}");
        assert_eq!(args[1], whole.1[1].arguments, "step {step}");
    }
}

#[test]
fn other_layouts_and_plain_text() {
    let (c, calls) = parse_all(
        "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>",
        &[],
    );
    assert_eq!(c, "");
    assert_eq!(calls[0].name, "f");
    assert_eq!(calls[0].arguments, "{\"a\":1}");
    let (c, calls) = parse_all("just <tool text", &[]);
    assert_eq!(c, "just <tool text");
    assert!(calls.is_empty());
    let (c, calls) = parse_all("<tool_call>not json</tool_call>", &[]);
    assert_eq!(c, "<tool_call>not json</tool_call>");
    assert!(calls.is_empty());
}

#[test]
fn a_call_cut_inside_its_arguments_is_dropped() {
    let cut = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Par";
    let (content, calls) = parse_all(cut, &[]);
    assert_eq!(content, "");
    assert!(calls.is_empty(), "{calls:?}");
    let mut p = ToolCallParser::new();
    p.push(cut);
    p.finish();
    assert_eq!(p.num_dropped, 1);
    // Whole arguments without the closing markup are kept, the call's `}` aside.
    let (_, calls) = parse_all(
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n",
        &[],
    );
    assert_eq!(calls[0].arguments, "{\"a\": 1}");
    let (_, calls) = parse_all(
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}",
        &[],
    );
    assert_eq!(calls[0].arguments, "{\"a\": 1}");
}

fn names() -> Vec<String> {
    vec!["get_weather".into()]
}

/// Parses `text` whole and in pieces of every size from 1 to 7 characters: the pieces join
/// to the whole; returns the whole reply's content and calls.
fn parsed_both_ways(text: &str) -> (String, Vec<ToolCall>) {
    let whole = parse_all(text, &names());
    let chars: Vec<char> = text.chars().collect();
    for step in 1..8 {
        let mut p = ToolCallParser::with_names(names());
        let mut events = Vec::new();
        for piece in chars.chunks(step) {
            events.extend(p.push(&piece.iter().collect::<String>()));
        }
        events.extend(p.finish());
        let mut content = String::new();
        let mut args = vec![String::new(); whole.1.len()];
        for e in events {
            match e {
                ToolEvent::Content(c) => content.push_str(&c),
                ToolEvent::CallStart { .. } => {}
                ToolEvent::Arguments { index, text } => args[index].push_str(&text),
            }
        }
        assert_eq!(content, whole.0, "step {step}");
        assert_eq!(p.calls, whole.1, "step {step}");
        for (a, c) in args.iter().zip(&whole.1) {
            assert_eq!(a, &c.arguments, "step {step}");
        }
    }
    whole
}

#[test]
fn calls_written_without_markup_are_calls() {
    // What Qwen2.5 Coder 0.5B writes with `tool_choice: auto`.
    let (c, calls) = parsed_both_ways(
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}",
    );
    assert_eq!(c, "");
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(
        calls[0].arguments,
        "{\"city\": \"Paris\", \"unit\": \"celsius\"}"
    );
    // What the 1.5B writes: a fence, the JSON over lines.
    let (c, calls) = parsed_both_ways(
        "Sure.\n```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\n    \"city\": \"Tokyo\"\n  }\n}\n```",
    );
    assert_eq!(c, "Sure.");
    let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
    assert_eq!(args, serde_json::json!({"city": "Tokyo"}));
    // Doubled braces, another tag, `parameters` for `arguments`.
    let (c, calls) =
        parsed_both_ways("{{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}}");
    assert_eq!((c.as_str(), calls.len()), ("", 1));
    assert_eq!(calls[0].arguments, "{\"city\": \"Oslo\"}");
    let (c, calls) = parsed_both_ways(
        "<function_call>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}</function_call> done",
    );
    assert_eq!(c, " done");
    assert_eq!(calls[0].arguments, "{\"city\":\"Rome\"}");
    // Not calls: JSON with another name, or with `name` not first; unknown functions.
    for text in [
        "{\"name\": \"John\", \"age\": 3}",
        "```json\n{\"city\": \"Paris\", \"name\": \"get_weather\"}\n```",
        "Use {\"name\": \"get_weatherx\"} here",
    ] {
        let (c, calls) = parsed_both_ways(text);
        assert_eq!((c.as_str(), calls.len()), (text, 0), "{text}");
    }
    // Without the names offered, only `<tool_call>` is a call.
    let (_, calls) = parse_all("{\"name\": \"get_weather\", \"arguments\": {}}", &[]);
    assert!(calls.is_empty());
}
