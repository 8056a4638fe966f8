// llama_logits: the reference side of edge-llm's synthetic-model tests. Loads a GGUF with
// llama.cpp, evaluates a fixed token sequence in one batch (every position's logits) and prints,
// as one JSON object on stdout, each position's logits at the requested token ids and its top
// ids. Built against libllama by scripts/synth/build-llamacpp-lib.sh; run by
// scripts/synth/make_refs.py.
//
// usage: llama_logits MODEL.gguf TOKENS(comma-separated) PICK(comma-separated ids) TOPK [N_CTX [FULL.bin]]
// LLAMA_LOGITS_FLASH_ATTN=1 in the environment turns flash attention on.
// FULL.bin (optional): every position's whole log-softmax, [positions][n_vocab] little-endian
// f16 (what a KL divergence needs; for the small vocabularies of the cases that ask for it).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>
#include <algorithm>

#include "ggml.h"
#include "llama.h"

static std::vector<int> parse_ids(const char *s) {
    std::vector<int> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (!item.empty()) out.push_back(std::atoi(item.c_str()));
    }
    return out;
}

static void quiet(enum ggml_log_level level, const char *text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL TOKENS PICK TOPK [N_CTX]\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    const std::vector<int> tokens = parse_ids(argv[2]);
    const std::vector<int> pick = parse_ids(argv[3]);
    const int topk = std::atoi(argv[4]);
    const int n_ctx = argc > 5 ? std::atoi(argv[5]) : 512;

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_ubatch = n_ctx;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    // Flash attention off unless LLAMA_LOGITS_FLASH_ATTN=1 (as llama-perplexity and llama-server
    // run on a CPU): off, llama.cpp rounds q and the attention weights to f16 for its products.
    const char *fa = getenv("LLAMA_LOGITS_FLASH_ATTN");
    cp.flash_attn_type = fa && fa[0] == '1' ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot create a context\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    llama_batch batch = llama_batch_init((int)tokens.size(), 0, 1);
    for (size_t i = 0; i < tokens.size(); i++) {
        batch.token[i] = tokens[i];
        batch.pos[i] = (llama_pos)i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = (int)tokens.size();
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "llama_decode failed\n");
        return 1;
    }
    printf("{\"n_vocab\": %d, \"positions\": [", n_vocab);
    for (size_t i = 0; i < tokens.size(); i++) {
        const float *logits = llama_get_logits_ith(ctx, (int32_t)i);
        std::vector<int> order(n_vocab);
        for (int t = 0; t < n_vocab; t++) order[t] = t;
        std::partial_sort(order.begin(), order.begin() + topk, order.end(),
                          [&](int a, int b) { return logits[a] > logits[b]; });
        double max = logits[order[0]], sum = 0;
        for (int t = 0; t < n_vocab; t++) sum += std::exp((double)logits[t] - max);
        printf("%s{\"logsumexp\": %.9g, \"top\": [", i ? ", " : "", max + std::log(sum));
        for (int k = 0; k < topk; k++) printf("%s[%d, %.9g]", k ? ", " : "", order[k], logits[order[k]]);
        printf("], \"picked\": [");
        for (size_t k = 0; k < pick.size(); k++) printf("%s%.9g", k ? ", " : "", logits[pick[k]]);
        printf("]}");
    }
    printf("]}\n");
    if (argc > 6) {
        FILE *f = fopen(argv[6], "wb");
        if (!f) {
            fprintf(stderr, "cannot write %s\n", argv[6]);
            return 1;
        }
        std::vector<ggml_fp16_t> row(n_vocab);
        for (size_t i = 0; i < tokens.size(); i++) {
            const float *logits = llama_get_logits_ith(ctx, (int32_t)i);
            double max = logits[0], sum = 0;
            for (int t = 1; t < n_vocab; t++) max = std::max(max, (double)logits[t]);
            for (int t = 0; t < n_vocab; t++) sum += std::exp((double)logits[t] - max);
            const double lse = max + std::log(sum);
            for (int t = 0; t < n_vocab; t++) row[t] = ggml_fp32_to_fp16((float)((double)logits[t] - lse));
            fwrite(row.data(), sizeof(ggml_fp16_t), row.size(), f);
        }
        fclose(f);
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
