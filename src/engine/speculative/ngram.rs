//! Prompt lookup: the continuation of the most recent earlier occurrence of a sequence's last
//! n tokens in its own prompt and output, longest n first. No model; it pays when the output
//! quotes the context (edits, summaries, code). Called by `Speculator::propose`.

/// Up to `k` tokens that followed the latest earlier match of the last `n` tokens of `tokens`,
/// for n from `max_n` down to `min_n`; empty when nothing matches.
pub fn propose(tokens: &[u32], min_n: usize, max_n: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 {
        return Vec::new();
    }
    for n in (min_n.max(1)..=max_n).rev() {
        if n >= len {
            continue;
        }
        let pattern = &tokens[len - n..];
        // Latest start first; a match must be followed by at least one token.
        for start in (0..len - n).rev() {
            if &tokens[start..start + n] == pattern {
                let from = start + n;
                let to = (from + k).min(len);
                return tokens[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::propose;

    #[test]
    fn continues_the_latest_longest_match() {
        // ... 1 2 3 9 9 ... 1 2 3 7 8 ... 2 3 -> the latest "2 3" is followed by 7 8.
        let t = [1, 2, 3, 9, 9, 5, 1, 2, 3, 7, 8, 6, 2, 3];
        assert_eq!(propose(&t, 1, 3, 4), vec![7, 8, 6, 2]);
        // Longest first: "1 2 3" matches before "2 3" would.
        let t = [1, 2, 3, 4, 5, 0, 2, 3, 6, 1, 2, 3];
        assert_eq!(propose(&t, 1, 3, 2), vec![4, 5]);
        assert_eq!(propose(&t, 1, 2, 2), vec![6, 1]);
    }

    #[test]
    fn nothing_without_a_match() {
        assert!(propose(&[1, 2, 3, 4], 2, 3, 4).is_empty());
        assert!(propose(&[1], 1, 3, 4).is_empty());
        assert!(propose(&[1, 2, 1, 2], 2, 2, 0).is_empty());
        // Too short for the smallest n-gram plus a continuation.
        assert!(propose(&[5, 5], 2, 2, 4).is_empty());
    }

    #[test]
    fn proposals_stop_at_the_end_of_the_tokens() {
        assert_eq!(propose(&[4, 4, 4], 1, 1, 5), vec![4]);
        assert_eq!(propose(&[1, 2, 1, 2, 1, 2], 2, 2, 8), vec![1, 2]);
    }
}
