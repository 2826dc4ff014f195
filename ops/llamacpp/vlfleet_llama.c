/* The few libllama calls the hybrid engine makes (service/engine/llama_lm.py), behind a flat C interface.
 *
 * Python reaches it with ctypes. A flat interface keeps llama.h's parameter structs (which change between
 * llama.cpp versions) on this side, where the compiler lays them out, instead of in hand-written ctypes
 * declarations. Built by ops/llamacpp/shim.py against the project's own llama.cpp build, shipped in the
 * vlfleet-llama-server wheel beside libllama.
 *
 * Positions are Qwen3-VL's M-RoPE: a text token has one position (llama.cpp spreads it over the sections), an
 * embedding row has four, given here row-major (t, y, x, z per row) and passed to llama.cpp section-major.
 */

#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "llama.h"

/* The interface's number: bumped with every change of a function's signature or meaning here, and checked by
 * service/engine/llama_worker.py, so a service never calls a shim of another interface (it would crash, not fail). */
#define VL_INTERFACE 4

typedef struct vl_lm {
    struct llama_model *model;
    struct llama_context *ctx;
    int32_t n_vocab, n_embd_inp, n_batch;
    int32_t spare; /* a sequence no conversation uses: vl_decode_step's padding row */
} vl_lm;

static int vl_verbose = 0;

static void vl_log(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (vl_verbose || level >= GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

/* A portable build's CPU variants are libraries beside libllama, loaded at run time (llama-server looks beside
 * itself): look where the libllama this process loaded is, in the wheel's bin/ or the build's. */
static void load_backends(void) {
    Dl_info info;
    char dir[4096];
    if (dladdr((void *)llama_backend_init, &info) && info.dli_fname != NULL) {
        snprintf(dir, sizeof(dir), "%s", info.dli_fname);
        ggml_backend_load_all_from_path(dirname(dir));
    }
}

/* NULL when the model cannot be loaded or the context made (llama.cpp has said why on stderr). */
vl_lm *vl_open(const char *path, int32_t n_ctx, int32_t n_seq, int32_t n_threads, int32_t n_batch, int32_t verbose,
               int32_t flash_attn) {
    vl_verbose = verbose;
    llama_log_set(vl_log, NULL);
    load_backends();
    llama_backend_init();
    vl_lm *lm = calloc(1, sizeof(*lm));
    if (lm == NULL) {
        return NULL;
    }
    struct llama_model_params mp = llama_model_default_params();
    lm->model = llama_model_load_from_file(path, mp);
    if (lm->model == NULL) {
        free(lm);
        return NULL;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = cp.n_ubatch = (uint32_t)n_batch;
    cp.n_seq_max = (uint32_t)n_seq + 1; /* and the spare */
    cp.kv_unified = true; /* one cache the sequences share: a busy conversation may use what idle ones do not */
    /* Flash attention skips other sequences' cells; without it every step multiplies the whole shared cache, and a
       conversation's decode slowed with each one kept. Its CPU kernel summed an f16 cache's values in f16, in the
       order the cells lie, so a conversation continued in cells laid out otherwise got other logits and a greedy
       answer could change with its neighbours: ops/llamacpp/patches makes it sum in f32, as llama.cpp asks. Off only
       for the bench, which times a step both ways (ops/bench/llama_steps.py). */
    cp.flash_attn_type = flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    if (n_threads > 0) {
        cp.n_threads = cp.n_threads_batch = n_threads;
    }
    lm->ctx = llama_init_from_model(lm->model, cp);
    if (lm->ctx == NULL) {
        llama_model_free(lm->model);
        free(lm);
        return NULL;
    }
    lm->n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(lm->model));
    lm->n_embd_inp = llama_model_n_embd_inp(lm->model);
    lm->n_batch = n_batch;
    lm->spare = n_seq;
    return lm;
}

void vl_close(vl_lm *lm) {
    if (lm != NULL) {
        llama_free(lm->ctx);
        llama_model_free(lm->model);
        free(lm);
    }
}

int32_t vl_interface(void) { return VL_INTERFACE; }
int32_t vl_n_vocab(const vl_lm *lm) { return lm->n_vocab; }
int32_t vl_n_embd_inp(const vl_lm *lm) { return lm->n_embd_inp; }
int32_t vl_n_ctx(const vl_lm *lm) { return (int32_t)llama_n_ctx(lm->ctx); }

/* Forget sequence seq's tokens at positions >= p0 (all of them for p0 = 0). */
int32_t vl_seq_rm(vl_lm *lm, int32_t seq, int32_t p0) {
    return llama_memory_seq_rm(llama_get_memory(lm->ctx), seq, p0, -1) ? 0 : -1;
}

/* Sequence seq's KV in llama.cpp's own serialised form (llama_state_seq_get_data): its size when buf is NULL,
 * else the bytes written (0: it did not fit or failed). Read to learn the cache's layout (types, rows, v_trans). */
int64_t vl_seq_get_state(vl_lm *lm, int32_t seq, uint8_t *buf, int64_t size) {
    if (buf == NULL) {
        return (int64_t)llama_state_seq_get_size(lm->ctx, seq);
    }
    return (int64_t)llama_state_seq_get_data(lm->ctx, buf, (size_t)size, seq);
}

/* Replace sequence seq with the KV in buf (that same form, here written by service/engine/kv_handoff.py from another
 * runtime's prefill); the bytes read, 0 when llama.cpp refused it (no room, or a layout it does not expect). */
int64_t vl_seq_set_state(vl_lm *lm, int32_t seq, const uint8_t *buf, int64_t size) {
    return (int64_t)llama_state_seq_set_data(lm->ctx, buf, (size_t)size, seq);
}

static int32_t copy_last_logits(vl_lm *lm, float *out) {
    const float *logits = llama_get_logits_ith(lm->ctx, -1);
    if (logits == NULL) {
        return -3;
    }
    memcpy(out, logits, sizeof(float) * (size_t)lm->n_vocab);
    return 0;
}

/* n text tokens of sequence seq at positions pos, in chunks of n_batch; the last one's logits into out (when not
 * NULL). llama_decode's code on failure: 1 = no room in the KV cache, others = an error. */
int32_t vl_decode_tokens(vl_lm *lm, int32_t seq, const int32_t *ids, const int32_t *pos, int32_t n, float *out) {
    struct llama_batch batch = llama_batch_init(lm->n_batch, 0, 1);
    int32_t rc = 0;
    for (int32_t at = 0; at < n && rc == 0; at += lm->n_batch) {
        int32_t m = n - at < lm->n_batch ? n - at : lm->n_batch;
        batch.n_tokens = m;
        for (int32_t i = 0; i < m; i++) {
            batch.token[i] = ids[at + i];
            batch.pos[i] = pos[at + i];
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = seq;
            batch.logits[i] = (int8_t)(out != NULL && at + i == n - 1);
        }
        rc = llama_decode(lm->ctx, batch);
    }
    llama_batch_free(batch);
    return rc != 0 ? rc : (out != NULL ? copy_last_logits(lm, out) : 0);
}

/* n embedding rows (n_embd_inp floats each) of sequence seq, positions pos4 row-major (4 per row). */
int32_t vl_decode_embd(vl_lm *lm, int32_t seq, const float *embd, const int32_t *pos4, int32_t n, float *out) {
    int32_t *pos = malloc(sizeof(int32_t) * 4 * (size_t)lm->n_batch);
    int32_t *n_seq_id = malloc(sizeof(int32_t) * (size_t)lm->n_batch);
    int32_t **seq_ids = malloc(sizeof(int32_t *) * (size_t)lm->n_batch);
    int8_t *logits = malloc((size_t)lm->n_batch);
    int32_t rc = (pos && n_seq_id && seq_ids && logits) ? 0 : -2;
    for (int32_t at = 0; at < n && rc == 0; at += lm->n_batch) {
        int32_t m = n - at < lm->n_batch ? n - at : lm->n_batch;
        for (int32_t i = 0; i < m; i++) {
            for (int32_t j = 0; j < 4; j++) {
                pos[j * m + i] = pos4[4 * (at + i) + j]; /* section-major within this chunk */
            }
            n_seq_id[i] = 1;
            seq_ids[i] = &seq;
            logits[i] = (int8_t)(out != NULL && at + i == n - 1);
        }
        struct llama_batch batch = {
            .n_tokens = m, .token = NULL, .embd = (float *)(embd + (size_t)at * (size_t)lm->n_embd_inp),
            .pos = pos, .n_seq_id = n_seq_id, .seq_id = seq_ids, .logits = logits,
        };
        rc = llama_decode(lm->ctx, batch);
    }
    free(pos);
    free(n_seq_id);
    free(seq_ids);
    free(logits);
    return rc != 0 ? rc : (out != NULL ? copy_last_logits(lm, out) : 0);
}

/* Rows a step of n sequences is given: ggml's repacked matmuls (Q4_0 and the like on x86) take a batch's rows four
 * at a time and each one left over alone, at about half the cost of four, so 4k+3 rows cost more than 4k+4. */
static int32_t padded(const vl_lm *lm, int32_t n) {
    return (n % 4 == 3 && n < lm->n_batch) ? n + 1 : n;
}

static int32_t decode_step(vl_lm *lm, const int32_t *seqs, const int32_t *ids, const int32_t *pos, int32_t n,
                           int32_t rows) {
    struct llama_batch batch = llama_batch_init(rows, 0, 1);
    batch.n_tokens = rows;
    for (int32_t i = 0; i < rows; i++) {
        /* the padding row: the first token again, alone in the spare sequence, no logits */
        batch.token[i] = ids[i < n ? i : 0];
        batch.pos[i] = i < n ? pos[i] : 0;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = i < n ? seqs[i] : lm->spare;
        batch.logits[i] = (int8_t)(i < n);
    }
    int32_t rc = llama_decode(lm->ctx, batch);
    llama_batch_free(batch);
    if (rows > n) {
        llama_memory_seq_rm(llama_get_memory(lm->ctx), lm->spare, -1, -1);
    }
    return rc;
}

/* One decode step for n sequences at once: token ids[i] of sequence seqs[i] at pos[i]; n x n_vocab logits into
 * out, in the order given. pad != 0 adds the padding row to a step of 4k+3: faster, but the rows then take the
 * 4-row kernel, so a seeded answer would depend on its batch; the engine passes 0, the bench compares both. */
int32_t vl_decode_step(vl_lm *lm, const int32_t *seqs, const int32_t *ids, const int32_t *pos, int32_t n,
                       int32_t pad, float *out) {
    if (n > lm->n_batch) {
        return -4;
    }
    int32_t rows = pad ? padded(lm, n) : n;
    int32_t rc = decode_step(lm, seqs, ids, pos, n, rows);
    if (rc == 1 && rows > n) { /* no room for the padding row: the step without it */
        rc = decode_step(lm, seqs, ids, pos, n, n);
    }
    for (int32_t i = 0; rc == 0 && i < n; i++) {
        const float *logits = llama_get_logits_ith(lm->ctx, i);
        if (logits == NULL) {
            rc = -3;
        } else {
            memcpy(out + (size_t)i * (size_t)lm->n_vocab, logits, sizeof(float) * (size_t)lm->n_vocab);
        }
    }
    return rc;
}
