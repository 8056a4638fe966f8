// llama_embed: the reference side of edge-llm's encoder tests (tests/encoder_models.rs). Loads an
// encoder GGUF (bert, nomic-bert) with llama.cpp and prints one JSON object on stdout:
//
//   llama_embed tokenize MODEL TEXT...   each text's ids with add_special and parse_special
//                                        (as llama-embedding tokenizes), and without either
//   llama_embed embed MODEL TEXT...      each text's ids, every token's embedding (pooling none),
//                                        and the model's pooled embedding, raw and normalized as
//                                        common_embd_normalize(2) does
//
// CPU, one thread, flash attention off, the whole text in one batch. Built against the static
// libraries by scripts/synth/encoder_refs.sh.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

static std::vector<llama_token> tokenize(const llama_vocab *vocab, const std::string &text, bool special) {
    int n = -llama_tokenize(vocab, text.data(), (int32_t)text.size(), nullptr, 0, special, special);
    std::vector<llama_token> out(n < 0 ? -n : n);
    if (n > 0) {
        llama_tokenize(vocab, text.data(), (int32_t)text.size(), out.data(), n, special, special);
    }
    return out;
}

static void print_ids(const std::vector<llama_token> &ids) {
    printf("[");
    for (size_t i = 0; i < ids.size(); i++) printf("%s%d", i ? "," : "", ids[i]);
    printf("]");
}

static void print_vec(const float *v, int n) {
    printf("[");
    for (int i = 0; i < n; i++) printf("%s%.9g", i ? "," : "", v[i]);
    printf("]");
}

static llama_context *context(llama_model *model, enum llama_pooling_type pooling, int n_ctx) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_ubatch = n_ctx;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.embeddings = true;
    cp.pooling_type = pooling;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    return llama_init_from_model(model, cp);
}

static bool run(llama_context *ctx, const std::vector<llama_token> &ids) {
    llama_batch batch = llama_batch_init((int)ids.size(), 0, 1);
    for (size_t i = 0; i < ids.size(); i++) {
        batch.token[i] = ids[i];
        batch.pos[i] = (llama_pos)i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = (int)ids.size();
    const bool ok = llama_decode(ctx, batch) == 0;
    llama_batch_free(batch);
    return ok;
}

int main(int argc, char **argv) {
    if (argc < 4 || (strcmp(argv[1], "tokenize") != 0 && strcmp(argv[1], "embed") != 0)) {
        fprintf(stderr, "usage: %s tokenize|embed MODEL TEXT...\n", argv[0]);
        return 2;
    }
    const bool embed = strcmp(argv[1], "embed") == 0;
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.vocab_only = !embed;
    llama_model *model = llama_model_load_from_file(argv[2], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[2]);
        return 1;
    }
    const llama_vocab *vocab = llama_model_get_vocab(model);
    if (!embed) {
        printf("{\"n_vocab\":%d,\"texts\":[", llama_vocab_n_tokens(vocab));
        for (int t = 3; t < argc; t++) {
            printf("%s{\"special\":", t > 3 ? "," : "");
            print_ids(tokenize(vocab, argv[t], true));
            printf(",\"plain\":");
            print_ids(tokenize(vocab, argv[t], false));
            printf("}");
        }
        printf("]}\n");
        llama_model_free(model);
        return 0;
    }
    const int n_ctx = llama_model_n_ctx_train(model);
    const int n_embd = llama_model_n_embd(model);
    llama_context *each = context(model, LLAMA_POOLING_TYPE_NONE, n_ctx);
    llama_context *pooled = context(model, LLAMA_POOLING_TYPE_UNSPECIFIED, n_ctx);
    if (!each || !pooled) {
        fprintf(stderr, "cannot create a context\n");
        return 1;
    }
    printf("{\"n_embd\":%d,\"pooling_type\":%d,\"texts\":[", n_embd, (int)llama_pooling_type(pooled));
    for (int t = 3; t < argc; t++) {
        const std::vector<llama_token> ids = tokenize(vocab, argv[t], true);
        if (!run(each, ids) || !run(pooled, ids)) {
            fprintf(stderr, "llama_decode failed on text %d\n", t - 3);
            return 1;
        }
        printf("%s{\"tokens\":", t > 3 ? "," : "");
        print_ids(ids);
        printf(",\"embd\":[");
        for (size_t i = 0; i < ids.size(); i++) {
            printf("%s", i ? "," : "");
            print_vec(llama_get_embeddings_ith(each, (int32_t)i), n_embd);
        }
        const float *p = llama_get_embeddings_seq(pooled, 0);
        printf("],\"pooled\":");
        print_vec(p, n_embd);
        // common_embd_normalize(p, out, n_embd, 2)
        double sum = 0.0;
        for (int i = 0; i < n_embd; i++) sum += p[i] * p[i];
        sum = std::sqrt(sum);
        const float norm = sum > 0.0 ? 1.0 / sum : 0.0f;
        std::vector<float> normed(n_embd);
        for (int i = 0; i < n_embd; i++) normed[i] = p[i] * norm;
        printf(",\"pooled_normalized\":");
        print_vec(normed.data(), n_embd);
        printf("}");
        llama_memory_clear(llama_get_memory(each), true);
        llama_memory_clear(llama_get_memory(pooled), true);
    }
    printf("]}\n");
    llama_free(each);
    llama_free(pooled);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
