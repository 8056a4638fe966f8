//! Perplexity of the default model on the GPL-3 text at context 512 against llama.cpp's
//! (../shared/reference: 18.3914 +/- 0.86455 over 14 chunks): the final value within 1%, and the
//! running value after every chunk within 2%. The looser per-chunk band is llama.cpp's own
//! spread across machines: its AVX2 build on a machine of this kind gives 16.3197 after chunk 1
//! where the reference (an AVX-512 machine) says 16.5546, 1.4% apart; over 14 chunks it evens out.

mod support;

#[test]
fn perplexity_within_one_percent_of_llama_cpp() {
    let model = support::model();
    let reference = support::reference();
    let r = &reference["perplexity_gpl3_c512"];
    let running: Vec<f64> = r["per_chunk_running"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let text = std::fs::read_to_string(r["file"].as_str().unwrap())
        .expect("GPL-3 text (Debian base-files)");
    let mut seen = Vec::new();
    let stats =
        edge_llm::scoring::perplexity::perplexity(model, &text, 512, None, |s| seen.push(s.ppl()))
            .unwrap();
    assert_eq!(stats.num_chunks, r["chunks"].as_u64().unwrap() as usize);
    for (i, (&got, &want)) in seen.iter().zip(&running).enumerate() {
        let rel = (got - want).abs() / want;
        assert!(
            rel < 0.02,
            "chunk {}: PPL {got:.4} vs llama.cpp {want:.4} ({:.2}% off)",
            i + 1,
            rel * 100.0
        );
    }
    let want = r["ppl"].as_f64().unwrap();
    eprintln!(
        "PPL = {:.4} +/- {:.5} (llama.cpp {want})",
        stats.ppl(),
        stats.ppl_error()
    );
    assert!((stats.ppl() - want).abs() / want < 0.01);
    assert!(
        (stats.ppl_error() - r["pm"].as_f64().unwrap()).abs() / r["pm"].as_f64().unwrap() < 0.05
    );
}
