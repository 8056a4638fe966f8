// sampler_ref: llama.cpp's side of edge-llm's sampler test (tests/samplers.rs). Generates a few
// rows of logits (a fixed LCG, written into the output so that both sides read the same floats),
// builds llama.cpp sampler chains from a list of configurations (each sampler alone, and chains
// in several `samplers` orders), feeds each chain a token history (`llama_sampler_accept`, as
// llama-server feeds the prompt), runs `llama_sampler_apply` on each row (no `dist` at the end)
// and records the candidates left with their probabilities after a last softmax. For Mirostat
// 1 and 2 it records, over several steps, the candidates left, the token llama.cpp drew and mu.
// Given a model, it also records how llama.cpp tokenizes DRY's default sequence breakers.
// Prints one JSON object on stdout. Built and run by scripts/synth/sampler_ref.sh.
//
// usage: sampler_ref [MODEL.gguf]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>
#include <algorithm>

#include "llama.h"

// Declared in llama.cpp's src/llama-sampler.h (not its public header).
struct llama_sampler * llama_sampler_init_dry_testing(float dry_multiplier, float dry_base,
        int32_t dry_allowed_length, int32_t dry_penalty_last_n,
        const std::vector<std::vector<llama_token>> & seq_breakers);

// The leading fields of llama.cpp's private sampler states, to read mu and the processed
// breakers back (same layout as src/llama-sampler.cpp).
struct mirostat_state {
    const int32_t n_vocab;
    const uint32_t seed;
    uint32_t seed_cur;
    const float tau;
    const float eta;
    const int32_t m;
    float mu;
};
struct mirostat_v2_state {
    const uint32_t seed;
    uint32_t seed_cur;
    const float tau;
    const float eta;
    float mu;
};
struct dry_state {
    const float dry_multiplier;
    const float dry_base;
    const int32_t dry_allowed_length;
    const int32_t dry_penalty_last_n;
    std::unordered_multimap<llama_token, std::vector<llama_token>> dry_processed_breakers;
};

static const int N_VOCAB = 512;
static const int N_ROWS = 3;

// A model-like row: most logits near -2, a long tail, a handful of strong candidates.
static std::vector<float> make_row(uint64_t seed) {
    uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    auto next = [&]() {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        return (double)(s >> 11) / (double)(1ULL << 53);
    };
    std::vector<float> row(N_VOCAB);
    for (int i = 0; i < N_VOCAB; ++i) {
        double u1 = next() + 1e-12, u2 = next();
        double g = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
        row[i] = (float)(g * 2.0 - 2.0);
    }
    for (int j = 0; j < 12; ++j) {
        int i = (int)(next() * N_VOCAB);
        row[i] += (float)(4.0 + next() * 6.0);
    }
    // Round to what %.9g prints, so the file holds exactly these floats.
    for (auto & v : row) {
        char buf[64];
        snprintf(buf, sizeof buf, "%.9g", v);
        v = strtof(buf, nullptr);
    }
    return row;
}

// A configuration, in edge-llm's (and llama-server's) field names.
struct Cfg {
    std::string name;
    std::string order; // llama.cpp's one-letter codes
    float temp = 0.8f;
    int top_k = 40;
    float top_p = 0.95f, min_p = 0.05f, typ_p = 1.0f, top_n_sigma = -1.0f;
    float xtc_p = 0.0f, xtc_t = 0.1f;
    float dyn_range = 0.0f, dyn_exp = 1.0f;
    int min_keep = 0;
    float repeat = 1.0f;
    int repeat_last_n = 64;
    float dry_mult = 0.0f, dry_base = 1.75f;
    int dry_allowed = 2, dry_last_n = 64;
};

static const std::vector<std::vector<llama_token>> DRY_BREAKERS = {{10}, {20, 21}};

// A token history with repeats (for the penalties and DRY): the tail "5 6 7 8" has appeared
// before, followed by 9 and by 30; a breaker (10) and a two-token breaker (20 21) cut others.
static const std::vector<llama_token> HISTORY = {
    3, 5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 8, 30, 11, 12, 13, 14, 15, 10, 12, 13, 14, 15, 40, 20, 21,
    44, 45, 46, 4, 44, 45, 46, 47, 100, 101, 5, 6, 7, 8};

static llama_sampler * make_chain(const Cfg & c) {
    llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    for (char k : c.order) {
        llama_sampler * s = nullptr;
        switch (k) {
            case 'e': s = llama_sampler_init_penalties(N_VOCAB, c.repeat_last_n, c.repeat, 0.0f, 0.0f); break;
            case 'd': s = llama_sampler_init_dry_testing(c.dry_mult, c.dry_base, c.dry_allowed, c.dry_last_n, DRY_BREAKERS); break;
            case 's': s = llama_sampler_init_top_n_sigma(c.top_n_sigma); break;
            case 'k': s = llama_sampler_init_top_k(c.top_k); break;
            case 'y': s = llama_sampler_init_typical(c.typ_p, c.min_keep); break;
            case 'p': s = llama_sampler_init_top_p(c.top_p, c.min_keep); break;
            case 'm': s = llama_sampler_init_min_p(c.min_p, c.min_keep); break;
            case 'x': s = llama_sampler_init_xtc(c.xtc_p, c.xtc_t, c.min_keep, 1234); break;
            case 't': s = llama_sampler_init_temp_ext(c.temp, c.dyn_range, c.dyn_exp); break;
            default: fprintf(stderr, "bad code %c\n", k); exit(2);
        }
        llama_sampler_chain_add(chain, s);
    }
    return chain;
}

static void print_row(const std::vector<float> & row) {
    printf("[");
    for (size_t i = 0; i < row.size(); ++i) printf("%s%.9g", i ? "," : "", row[i]);
    printf("]");
}

// The candidates left, after a softmax over them (llama_sampler_softmax_impl, no sort); those
// with probability 0 (a logit of minus infinity) are not kept.
static void print_kept(llama_token_data_array & cur) {
    float max_l = -INFINITY;
    for (size_t i = 0; i < cur.size; ++i) max_l = std::max(max_l, cur.data[i].logit);
    float sum = 0.0f;
    for (size_t i = 0; i < cur.size; ++i) {
        cur.data[i].p = expf(cur.data[i].logit - max_l);
        sum += cur.data[i].p;
    }
    printf("[");
    bool first = true;
    for (size_t i = 0; i < cur.size; ++i) {
        float p = cur.data[i].p / sum;
        if (p > 0.0f) {
            printf("%s[%d,%.9g]", first ? "" : ",", cur.data[i].id, p);
            first = false;
        }
    }
    printf("]");
}

static void print_cfg_fields(const Cfg & c) {
    printf("{\"temperature\":%.9g,\"top_k\":%d,\"top_p\":%.9g,\"min_p\":%.9g,\"typical_p\":%.9g,"
           "\"top_n_sigma\":%.9g,\"xtc_probability\":%.9g,\"xtc_threshold\":%.9g,"
           "\"dynatemp_range\":%.9g,\"dynatemp_exponent\":%.9g,\"min_keep\":%d,"
           "\"repeat_penalty\":%.9g,\"repeat_last_n\":%d,\"dry_multiplier\":%.9g,\"dry_base\":%.9g,"
           "\"dry_allowed_length\":%d,\"dry_penalty_last_n\":%d,\"samplers\":\"%s\"}",
           c.temp, c.top_k, c.top_p, c.min_p, c.typ_p, c.top_n_sigma, c.xtc_p, c.xtc_t,
           c.dyn_range, c.dyn_exp, c.min_keep, c.repeat, c.repeat_last_n, c.dry_mult, c.dry_base,
           c.dry_allowed, c.dry_last_n, c.order.c_str());
}

static std::vector<Cfg> configs() {
    std::vector<Cfg> v;
    auto add = [&](const char * name, const char * order, auto set) {
        Cfg c;
        c.name = name;
        c.order = order;
        set(c);
        v.push_back(c);
    };
    // Each sampler alone (with the temperature last, as a chain ends).
    add("temperature", "t", [](Cfg & c) { c.temp = 0.7f; });
    add("top_k", "kt", [](Cfg & c) { c.top_k = 25; });
    add("top_p", "pt", [](Cfg & c) { c.top_p = 0.8f; });
    add("top_p_min_keep", "pt", [](Cfg & c) { c.top_p = 0.3f; c.min_keep = 5; });
    add("min_p", "mt", [](Cfg & c) { c.min_p = 0.02f; });
    add("min_p_min_keep", "mt", [](Cfg & c) { c.min_p = 0.5f; c.min_keep = 4; });
    add("typical", "yt", [](Cfg & c) { c.typ_p = 0.7f; });
    add("typical_min_keep", "yt", [](Cfg & c) { c.typ_p = 0.05f; c.min_keep = 6; });
    add("top_n_sigma", "st", [](Cfg & c) { c.top_n_sigma = 1.5f; });
    add("xtc", "xt", [](Cfg & c) { c.xtc_p = 1.0f; c.xtc_t = 0.05f; });
    add("xtc_min_keep", "kxt", [](Cfg & c) { c.top_k = 10; c.xtc_p = 1.0f; c.xtc_t = 0.01f; c.min_keep = 9; });
    add("dynatemp", "t", [](Cfg & c) { c.temp = 1.0f; c.dyn_range = 0.5f; c.dyn_exp = 1.0f; });
    add("dynatemp_exp", "kt", [](Cfg & c) { c.top_k = 60; c.temp = 0.6f; c.dyn_range = 0.8f; c.dyn_exp = 2.5f; });
    add("penalties", "et", [](Cfg & c) { c.repeat = 1.3f; c.repeat_last_n = 16; });
    add("dry", "dt", [](Cfg & c) { c.dry_mult = 0.8f; });
    add("dry_long", "dt", [](Cfg & c) { c.dry_mult = 1.5f; c.dry_base = 2.5f; c.dry_allowed = 1; c.dry_last_n = 40; });
    add("dry_short_window", "dt", [](Cfg & c) { c.dry_mult = 1.0f; c.dry_last_n = 10; });
    // Chains in several orders.
    add("default_chain", "edskypmxt", [](Cfg & c) {
        c.repeat = 1.1f; c.dry_mult = 0.8f; c.top_n_sigma = 2.0f; c.typ_p = 0.95f; c.xtc_p = 1.0f; c.xtc_t = 0.1f; });
    add("front_end_order", "dkypmxt", [](Cfg & c) {
        c.dry_mult = 0.5f; c.typ_p = 0.9f; c.top_p = 0.9f; c.min_p = 0.02f; c.xtc_p = 1.0f; c.xtc_t = 0.08f; c.min_keep = 2; });
    add("temperature_first", "tkpm", [](Cfg & c) { c.temp = 1.3f; c.top_k = 50; });
    add("min_p_then_top_k", "mkyt", [](Cfg & c) { c.min_p = 0.01f; c.top_k = 30; c.typ_p = 0.8f; });
    add("sigma_dynatemp", "skt", [](Cfg & c) { c.top_n_sigma = 1.0f; c.top_k = 0; c.dyn_range = 0.3f; });
    add("xtc_then_top_p", "kxpt", [](Cfg & c) { c.top_k = 30; c.xtc_p = 1.0f; c.xtc_t = 0.02f; c.top_p = 0.7f; });
    return v;
}

int main(int argc, char ** argv) {
    llama_backend_init();
    std::vector<std::vector<float>> rows;
    for (int r = 0; r < N_ROWS; ++r) rows.push_back(make_row(1000 + r));

    printf("{\"n_vocab\":%d,\"logits\":[", N_VOCAB);
    for (int r = 0; r < N_ROWS; ++r) {
        if (r) printf(",");
        print_row(rows[r]);
    }
    printf("],\"history\":[");
    for (size_t i = 0; i < HISTORY.size(); ++i) printf("%s%d", i ? "," : "", HISTORY[i]);
    printf("],\"dry_breaker_tokens\":[[10],[20,21]],\"chains\":[");

    bool first_cfg = true;
    for (const Cfg & c : configs()) {
        llama_sampler * chain = make_chain(c);
        for (llama_token t : HISTORY) llama_sampler_accept(chain, t);
        printf("%s{\"name\":\"%s\",\"fields\":", first_cfg ? "" : ",", c.name.c_str());
        first_cfg = false;
        print_cfg_fields(c);
        printf(",\"kept\":[");
        for (int r = 0; r < N_ROWS; ++r) {
            std::vector<llama_token_data> data(N_VOCAB);
            for (int i = 0; i < N_VOCAB; ++i) data[i] = {i, rows[r][i], 0.0f};
            llama_token_data_array cur = {data.data(), data.size(), -1, false};
            llama_sampler_apply(chain, &cur);
            if (r) printf(",");
            print_kept(cur);
        }
        printf("]}");
        llama_sampler_free(chain);
    }
    printf("],\"mirostat\":[");

    // Mirostat: temperature then Mirostat (common_sampler_init's chain), 6 steps over the rows.
    const float tau = 3.0f, eta = 0.15f, temp = 0.9f;
    for (int version = 1; version <= 2; ++version) {
        llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
        llama_sampler_chain_add(chain, llama_sampler_init_temp(temp));
        llama_sampler_chain_add(chain, version == 1
            ? llama_sampler_init_mirostat(N_VOCAB, 42, tau, eta, 100)
            : llama_sampler_init_mirostat_v2(42, tau, eta));
        void * st = llama_sampler_chain_get(chain, 1)->ctx;
        printf("%s{\"fields\":{\"mirostat\":%d,\"mirostat_tau\":%.9g,\"mirostat_eta\":%.9g,\"temperature\":%.9g},\"steps\":[",
               version == 1 ? "" : ",", version, tau, eta, temp);
        for (int step = 0; step < 6; ++step) {
            std::vector<llama_token_data> data(N_VOCAB);
            const auto & row = rows[step % N_ROWS];
            for (int i = 0; i < N_VOCAB; ++i) data[i] = {i, row[i], 0.0f};
            llama_token_data_array cur = {data.data(), data.size(), -1, false};
            llama_sampler_apply(chain, &cur);
            float mu = version == 1 ? ((mirostat_state *) st)->mu : ((mirostat_v2_state *) st)->mu;
            printf("%s{\"kept\":[", step ? "," : "");
            for (size_t i = 0; i < cur.size; ++i) printf("%s[%d,%.9g]", i ? "," : "", cur.data[i].id, cur.data[i].p);
            printf("],\"chosen\":%d,\"mu\":%.9g}", cur.data[cur.selected].id, mu);
        }
        printf("]}");
        llama_sampler_free(chain);
    }
    printf("]");

    // DRY's default breakers tokenized against a real vocabulary.
    if (argc > 1) {
        llama_model_params mp = llama_model_default_params();
        mp.vocab_only = true;
        llama_model * model = llama_model_load_from_file(argv[1], mp);
        if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
        const llama_vocab * vocab = llama_model_get_vocab(model);
        const char * breakers[] = {"\n", ":", "\"", "*"};
        llama_sampler * dry = llama_sampler_init_dry(vocab, 1.0f, 1.75f, 2, 64, breakers, 4);
        auto & m = ((dry_state *) dry->ctx)->dry_processed_breakers;
        std::vector<std::vector<llama_token>> seqs;
        for (const auto & kv : m) {
            std::vector<llama_token> s = {kv.first};
            s.insert(s.end(), kv.second.begin(), kv.second.end());
            seqs.push_back(s);
        }
        std::sort(seqs.begin(), seqs.end());
        printf(",\"dry_default_breakers\":{\"model\":\"%s\",\"sequences\":[", argv[1]);
        for (size_t i = 0; i < seqs.size(); ++i) {
            printf("%s[", i ? "," : "");
            for (size_t j = 0; j < seqs[i].size(); ++j) printf("%s%d", j ? "," : "", seqs[i][j]);
            printf("]");
        }
        printf("]}");
        llama_sampler_free(dry);

        // The infill stage (llama_sampler_infill) on the same rows with this vocabulary's
        // pieces and end-of-generation tokens: after top-k (and top-p, llama.vscode's order),
        // and with the row's end-of-generation ids lifted above the rest (they take over).
        std::vector<llama_token> eog;
        for (llama_token t = 0; t < N_VOCAB; ++t) if (llama_vocab_is_eog(vocab, t)) eog.push_back(t);
        printf(",\"infill\":{\"eog_ids\":[");
        for (size_t i = 0; i < eog.size(); ++i) printf("%s%d", i ? "," : "", eog[i]);
        printf("],\"cases\":[");
        struct InfillCase { const char * name; int top_k; float top_p; const char * order; float eog_lift; };
        const InfillCase cases[] = {
            {"top_k_infill", 40, 1.0f, "ki", 0.0f},
            {"vscode_order", 40, 0.95f, "kpi", 0.0f},
            {"eog_takes_over", 40, 1.0f, "ki", 2.0f},
        };
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ++ci) {
            const InfillCase & ic = cases[ci];
            llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
            llama_sampler_chain_add(chain, llama_sampler_init_top_k(ic.top_k));
            if (ic.top_p < 1.0f) llama_sampler_chain_add(chain, llama_sampler_init_top_p(ic.top_p, 1));
            llama_sampler_chain_add(chain, llama_sampler_init_infill(vocab));
            printf("%s{\"name\":\"%s\",\"fields\":{\"top_k\":%d,\"top_p\":%.9g,\"samplers\":\"%s\"},\"eog_lift\":%.9g,\"kept\":[",
                   ci ? "," : "", ic.name, ic.top_k, ic.top_p, ic.order, ic.eog_lift);
            for (int r = 0; r < N_ROWS; ++r) {
                std::vector<llama_token_data> data(N_VOCAB);
                float max_l = -INFINITY;
                for (int i = 0; i < N_VOCAB; ++i) max_l = std::max(max_l, rows[r][i]);
                for (int i = 0; i < N_VOCAB; ++i) data[i] = {i, rows[r][i], 0.0f};
                if (ic.eog_lift > 0.0f) for (llama_token t : eog) data[t].logit = max_l + ic.eog_lift;
                llama_token_data_array cur = {data.data(), data.size(), -1, false};
                llama_sampler_apply(chain, &cur);
                if (r) printf(",");
                print_kept(cur);
            }
            printf("]}");
            llama_sampler_free(chain);
        }
        printf("]}");
        llama_model_free(model);
    }
    printf(",\"llama_cpp\":\"%s\"}\n", getenv("LLAMA_CPP_DESC") ? getenv("LLAMA_CPP_DESC") : "");
    return 0;
}
