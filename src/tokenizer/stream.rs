//! `StreamDecoder`: turns generated token ids into text one token at a time without ever
//! emitting a broken UTF-8 sequence (a multi-byte char can span several byte tokens).
//!
//! Used by the generation loop and the faces that stream text (chat, serve, pipes); one per
//! sequence. The concatenated output equals `Tokenizer::decode` of all the ids.

use super::Tokenizer;

/// Holds the bytes of an incomplete UTF-8 char between tokens.
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// The text that token `id` completes: every complete char so far, possibly empty.
    /// Bytes that can never become valid UTF-8 come out as U+FFFD, as in a lossy decode.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.pending.extend_from_slice(&tok.token_bytes(id));
        let mut out = String::new();
        let mut rest = self.pending.as_slice();
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    out.push_str(valid);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).expect("checked prefix"));
                    match e.error_len() {
                        // An incomplete char at the end: keep it for the next token.
                        None => {
                            rest = after;
                            break;
                        }
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// Forgets the bytes of a char still incomplete (for a stream cut by a token limit, whose
    /// next token would have completed it); bytes that can never be valid stay for `finish`.
    pub fn drop_incomplete(&mut self) {
        if let Err(e) = std::str::from_utf8(&self.pending) {
            if e.error_len().is_none() {
                self.pending.truncate(e.valid_up_to());
            }
        }
    }

    /// Flushes what is left at the end of the stream (an incomplete char becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}
