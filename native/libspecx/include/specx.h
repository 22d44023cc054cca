/* libspecx: the specx speculative-decoding runtime as a C library.
 *
 * It loads an artifact written by `specx export` (manifest.json, the ONNX graphs, the specx
 * kernels library where the manifest names it) and runs the same speculative loop as the Python
 * runtime: the same passes, so the same tokens. Token ids in, token ids out; encoding text stays
 * with the host (tokenizer.json sits in the artifact folder for any tokenizers binding).
 *
 * Conventions (as llama.h and ONNX Runtime GenAI's C API):
 *   - handles are opaque; every `*_create` / `*_load` has its `*_destroy` (NULL is accepted);
 *   - every call that can fail returns a specx_status*: NULL on success, else a status the
 *     caller reads (code, message) and frees with specx_status_destroy; nothing is thrown
 *     across the ABI and no call aborts the process on bad input;
 *   - strings are UTF-8 and NUL-terminated; strings returned by the library live as long as the
 *     handle they came from.
 *
 * Threads: a loaded specx_model is read-only after specx_model_load and may be shared by any
 * number of threads, each running its own specx_generation. One generation must not be used
 * from two threads at once, except specx_generation_cancel, which any thread may call at any
 * time. specx_model_destroy must come after every generation of the model is destroyed.
 *
 * Streaming is a pull loop (specx_generation_next runs one speculative step and returns the
 * tokens it committed): the host decides when to run the next step, on which thread, and
 * whether to stop, with no callback re-entering its code from inside the library.
 */
#ifndef SPECX_H
#define SPECX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define SPECX_API __declspec(dllexport)
#else
#define SPECX_API __attribute__((visibility("default")))
#endif

/* The ABI's version: bumped on any incompatible change of this header (2: specx_stats gained
 * reused_prompt_tokens; contexts and cache scopes were added). */
#define SPECX_ABI_VERSION 2
/* The most draft tokens a step may verify (K), as in the Python runtime. */
#define SPECX_MAX_K 16
/* The most tokens one step commits: K accepted drafts plus the target's token. */
#define SPECX_MAX_STEP_TOKENS (SPECX_MAX_K + 1)
/* K values with a meaning of their own (specx_params_set_k). */
#define SPECX_K_DEFAULT (-1) /* the artifact's profile's k_default (else 4); 0 with no drafter */
#define SPECX_K_AUTO (-2)    /* chosen before every step (-k auto) */

typedef enum specx_code {
  SPECX_OK = 0,
  SPECX_INVALID_ARGUMENT = 1, /* a bad value from the caller: null handle, K out of range, ... */
  SPECX_ARTIFACT = 2,         /* the artifact is missing, corrupt or of an unknown version */
  SPECX_PROVIDER = 3,         /* the execution provider or the kernels library cannot run it */
  SPECX_UNSUPPORTED = 4,      /* valid, but not implemented by this libspecx (the message says) */
  SPECX_RUNTIME = 5,          /* ONNX Runtime failed during a pass */
  SPECX_OUT_OF_MEMORY = 6
} specx_code;

typedef struct specx_status specx_status;
typedef struct specx_model_options specx_model_options;
typedef struct specx_model specx_model;
typedef struct specx_params specx_params;
typedef struct specx_context specx_context;
typedef struct specx_generation specx_generation;

SPECX_API int specx_abi_version(void);
SPECX_API const char* specx_version(void);

SPECX_API specx_code specx_status_code(const specx_status* status);
SPECX_API const char* specx_status_message(const specx_status* status);
SPECX_API void specx_status_destroy(specx_status* status);

/* -- loading ------------------------------------------------------------------------------- */
SPECX_API specx_status* specx_model_options_create(specx_model_options** out);
SPECX_API void specx_model_options_destroy(specx_model_options* options);
/* intra-op threads per session (0: ONNX Runtime's default) */
SPECX_API specx_status* specx_model_options_set_threads(specx_model_options* options, int threads);
/* ONNX Runtime's execution provider: "cpu" (default), "cuda" or "tensorrt" where the ONNX
 * Runtime libspecx runs on has them (onnxruntime-gpu's library); with a GPU provider the caches
 * live on the GPU and ONNX Runtime's CPU provider takes the operators it lacks. Checked by
 * specx_model_load (SPECX_PROVIDER names what is missing). */
SPECX_API specx_status* specx_model_options_set_provider(specx_model_options* options,
                                                         const char* provider);
/* the GPU for "cuda" and "tensorrt" (default 0) */
SPECX_API specx_status* specx_model_options_set_device_id(specx_model_options* options,
                                                          int device_id);
/* the specx kernels library for artifacts whose manifest names it; default: the environment
 * variable SPECX_KERNELS_LIBRARY, else libspecx_kernels.so beside libspecx */
SPECX_API specx_status* specx_model_options_set_kernels_library(specx_model_options* options,
                                                                const char* path);

/* options may be NULL (defaults) */
SPECX_API specx_status* specx_model_load(const char* folder, const specx_model_options* options,
                                         specx_model** out);
SPECX_API void specx_model_destroy(specx_model* model);

SPECX_API int64_t specx_model_vocab_size(const specx_model* model);
SPECX_API int64_t specx_model_max_length(const specx_model* model);
/* the end-of-sequence ids of the manifest: count, and the i-th */
SPECX_API size_t specx_model_eos_count(const specx_model* model);
SPECX_API int64_t specx_model_eos_id(const specx_model* model, size_t i);
/* the drafters the artifact offers (as `specx run --draft`), and the default one */
SPECX_API size_t specx_model_drafter_count(const specx_model* model);
SPECX_API const char* specx_model_drafter_name(const specx_model* model, size_t i);
SPECX_API const char* specx_model_default_drafter(const specx_model* model);

/* -- text ---------------------------------------------------------------------------------- */
/* Token ids to UTF-8 text as they stream in, exactly as the artifact's tokenizer decodes them
 * (the `tokenizers` library's decode, special tokens skipped), never splitting a character:
 * the bytes of an unfinished character wait for the next ids. Exact for ByteLevel BPE
 * tokenizers (GPT-2, Llama 3, Qwen, SmolLM2); other decoders are SPECX_UNSUPPORTED. Encoding
 * text stays with the host. One detokenizer per stream; the model outlives it. */
typedef struct specx_detokenizer specx_detokenizer;
SPECX_API specx_status* specx_detokenizer_create(const specx_model* model, specx_detokenizer** out);
SPECX_API void specx_detokenizer_destroy(specx_detokenizer* detokenizer);
/* The text `ids` complete: *text (NUL-terminated, *length bytes) stays valid until the next
 * call on this detokenizer. Ids outside 0..vocab_size-1 are SPECX_INVALID_ARGUMENT. */
SPECX_API specx_status* specx_detokenizer_push(specx_detokenizer* detokenizer, const int64_t* ids,
                                               size_t count, const char** text, size_t* length);
/* The end of the stream: what is left (an unfinished character becomes U+FFFD, as decode
 * gives it); the detokenizer then starts a new stream. */
SPECX_API specx_status* specx_detokenizer_finish(specx_detokenizer* detokenizer, const char** text,
                                                 size_t* length);

/* -- what one generation is asked to do ----------------------------------------------------- */
SPECX_API specx_status* specx_params_create(specx_params** out);
SPECX_API void specx_params_destroy(specx_params* params);
SPECX_API specx_status* specx_params_set_max_new_tokens(specx_params* params, int64_t n);
/* 0..SPECX_MAX_K, SPECX_K_DEFAULT or SPECX_K_AUTO */
SPECX_API specx_status* specx_params_set_k(specx_params* params, int k);
/* the most K that SPECX_K_AUTO may choose, 1..SPECX_MAX_K (default 8; the profile's k_max caps it) */
SPECX_API specx_status* specx_params_set_max_k(specx_params* params, int max_k);
/* a name from specx_model_drafter_name, or NULL for the artifact's default */
SPECX_API specx_status* specx_params_set_drafter(specx_params* params, const char* name);
/* ids that end the generation besides the manifest's end tokens (emitted, then it stops) */
SPECX_API specx_status* specx_params_set_stop_ids(specx_params* params, const int64_t* ids,
                                                  size_t n);
/* sampling: temperature 0 (default) is greedy; top_k 0, top_p 1 and min_p 0 are off. The warp
 * and its order are the Python runtime's (docs/artifact-format.md, "Sampling"). */
SPECX_API specx_status* specx_params_set_sampling(specx_params* params, double temperature,
                                                  int top_k, double top_p, double min_p);
/* the seed of the counter-based random numbers (without one: a fresh seed per generation); the
 * same seed gives the Python runtime's text */
SPECX_API specx_status* specx_params_set_seed(specx_params* params, uint64_t seed);
/* how sampled drafts are verified: "invariant" (default; the text depends on the seed alone,
 * the same for every K and drafter) or "rejection" (Leviathan et al.) */
SPECX_API specx_status* specx_params_set_verification(specx_params* params, const char* name);
/* whose prompts a generation in a context may reuse, and whose later generations may reuse it
 * (a tenant, a conversation: default ""), and whose earlier outputs suffix drafting reads; NULL:
 * neither (nothing is kept for it, nothing of it is kept) */
SPECX_API specx_status* specx_params_set_cache_scope(specx_params* params, const char* scope);

/* The counter-based generator of docs/artifact-format.md ("Random numbers"): uniform `index` in
 * [0, 1) of the key (seed, stream, position). For engines that must draw what specx draws. */
SPECX_API double specx_counter_uniform(uint64_t seed, uint64_t stream, uint64_t position,
                                       uint64_t index);

/* -- a context: caches kept between generations ----------------------------------------------
 * A context keeps the caches of the generations run in it (the target's and each draft model's)
 * after they end: a generation created in it keeps the longest prefix of its prompt they hold
 * for its cache scope and reads only the rest (a conversation's next turn reads the new turn
 * only; stats.reused_prompt_tokens counts what it kept). One generation at a time per context
 * (a second is SPECX_INVALID_ARGUMENT until the first is destroyed); contexts are independent,
 * so a host keeps one per conversation or per worker thread. The model outlives its contexts,
 * and a context the generations created in it. */
SPECX_API specx_status* specx_context_create(const specx_model* model, specx_context** out);
SPECX_API void specx_context_destroy(specx_context* context);

/* -- a generation --------------------------------------------------------------------------- */
/* Checks the prompt and the settings against the artifact and reserves the caches; the
 * prompt's passes run on the first specx_generation_next. */
SPECX_API specx_status* specx_generation_create(const specx_model* model, const int64_t* prompt,
                                                size_t prompt_len, const specx_params* params,
                                                specx_generation** out);
/* The same in `context` (of `model`), which the generation holds until it is destroyed. */
SPECX_API specx_status* specx_generation_create_in(specx_context* context, const int64_t* prompt,
                                                   size_t prompt_len, const specx_params* params,
                                                   specx_generation** out);
SPECX_API void specx_generation_destroy(specx_generation* generation);
/* Runs one step (the first also runs the prompt) and copies the tokens it committed into
 * `tokens` (capacity >= SPECX_MAX_STEP_TOKENS): *n_tokens of them; *done is 1 once the
 * generation has stopped (then no step runs and *n_tokens is 0). */
SPECX_API specx_status* specx_generation_next(specx_generation* generation, int64_t* tokens,
                                              size_t capacity, size_t* n_tokens, int* done);
/* Any thread, any time: the generation stops before its next step (stop reason "cancelled"). */
SPECX_API void specx_generation_cancel(specx_generation* generation);

typedef struct specx_stats {
  int64_t prompt_tokens;
  int64_t new_tokens;
  int64_t target_passes;   /* after the prompt: each verifies up to K + 1 tokens */
  int64_t draft_passes;    /* draft-model passes (0 for a lookup drafter) */
  int64_t proposed;        /* draft tokens sent to verification */
  int64_t accepted;        /* of them, accepted by the target */
  int64_t rejections;      /* steps whose proposal was cut short by a rejected token */
  int64_t proposed_at[SPECX_MAX_K]; /* index i: steps that proposed a token i + 1 */
  int64_t accepted_at[SPECX_MAX_K]; /* index i: steps whose token i + 1 was accepted */
  double prefill_s;        /* both models' prompt passes */
  double draft_s;
  double verify_s;
  double decode_s;
  double tokens_per_s;     /* new tokens / (prefill + decode) */
  double decode_tokens_per_s;
  int k;                   /* the K asked for (0: target alone; K auto: its most) */
  int adaptive;            /* 1: K chosen before every step (SPECX_K_AUTO) */
  const char* drafter;     /* the drafter's name ("none": the target alone) */
  const char* stop_reason; /* "" (running), eos, stop_id, max_new_tokens, max_length,
                              cancelled, error (a step failed: the generation is over) */
  int64_t reused_prompt_tokens; /* of prompt_tokens, kept from the context's caches */
} specx_stats;

/* The generation's statistics so far; its strings live as long as the generation. */
SPECX_API specx_status* specx_generation_stats(const specx_generation* generation,
                                               specx_stats* out);

#ifdef __cplusplus
}
#endif

#endif /* SPECX_H */
