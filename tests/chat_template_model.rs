//! The default model's own chat template (ChatML with SmolLM's default system prompt), rendered
//! and encoded; moved out of `src/chat_template` so that a missing model fails like every other
//! model test instead of skipping.

mod support;

use edge_llm::chat_template::{encode_prompt, ChatMessage, ChatTemplate};

#[test]
fn default_model_template_renders_chatml_with_default_system_prompt() {
    let model = support::model();
    let t = ChatTemplate::from_gguf(&model.file, &model.tokenizer).unwrap();
    let prompt = t
        .render(&[ChatMessage::new("user", "Hi there")], true)
        .unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    );
    let own = t
        .render(
            &[
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Hi"),
                ChatMessage::new("assistant", "Hello!"),
            ],
            false,
        )
        .unwrap();
    assert_eq!(own, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n");
    let ids = t
        .encode(&model.tokenizer, &[ChatMessage::new("user", "Hi")], true)
        .unwrap();
    assert_eq!(ids[0], 1, "<|im_start|> is one control token");
    assert_eq!(ids.iter().filter(|&&id| id == 1).count(), 3);
    assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 2);
}

#[test]
fn bos_is_not_doubled() {
    let model = support::model();
    let tok = &model.tokenizer;
    let text = "<|im_start|>user\nHi<|im_end|>\n";
    let ids = encode_prompt(tok, text).unwrap();
    let plain = tok.encode(text, false, true).unwrap();
    match tok.bos_id().filter(|_| tok.add_bos_default()) {
        Some(bos) if plain[0] == bos => assert_eq!(ids, plain),
        Some(bos) => assert_eq!(ids[0], bos),
        None => assert_eq!(ids, plain),
    }
}
