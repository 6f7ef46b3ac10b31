/* spm.cc — sentencepiece BPE behind a C interface (the one C++ file in core/): the
 * pn_spm_* and pn_sha256_* functions of penumbra.h, used by lua/penumbra/text/bpe.lua.
 *
 * sentencepiece (Debian libsentencepiece-dev, 0.1.97) is C++ with util::Status results; this
 * shim turns every non-ok status and every exception into penumbra's error mechanism (the
 * thread-local message of pn_last_error, a pn_status or NULL result). Nothing here aborts:
 * sentencepiece's fatal CHECKs sit behind argument checks done first (empty input, ids out
 * of range, invalid UTF-8).
 *
 * Results of variable size (ids, strings) are malloc'd by the shim and handed to the caller,
 * who releases them with pn_spm_buf_free — one FFI call per line or per batch, no size
 * guessing. An empty result is a valid non-NULL pointer with length 0; NULL means error.
 *
 * Training reads the text files itself (a SentenceIterator: one sentence per line, the
 * newline removed and nothing else, as sentencepiece's own file reader does — so paths may
 * contain commas, and an unreadable file is named) and lets sentencepiece write
 * <prefix>.model and <prefix>.vocab. Settings: model_type bpe, pad 0, unk 1, bos 2, eos 3,
 * every input sentence used in file order (input_sentence_size 0, no shuffling: the result
 * depends only on the text and the settings; num_threads changes the speed and the
 * num_threads field stored in the model, not the vocabulary), quiet (minloglevel 2). The
 * default normaliser nmt_nfkc folds NBSP to a space, TABs to spaces, and trims and squeezes
 * whitespace. */
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

extern "C" {
#include "penumbra.h"
/* core/error.c (internal.h is C11 and not included here) */
pn_status pn_error(pn_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void *pn_error_null(pn_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
}

namespace spm = sentencepiece;

struct pn_spm {
    spm::SentencePieceProcessor sp;
    std::string path;
};

/* ---- helpers ---------------------------------------------------------------------------- */
namespace {

/* Strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF). Returns the byte
 * offset of the first bad sequence, or -1 when s is valid. */
int64_t utf8_invalid_at(const char *s, int64_t n) {
    const unsigned char *p = (const unsigned char *)s;
    int64_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) { i++; continue; }
        int len;
        unsigned cp;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
        else return i;
        if (i + len > n) return i;
        for (int k = 1; k < len; k++) {
            unsigned d = p[i + k];
            if ((d & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (d & 0x3F);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return i;
        i += len;
    }
    return -1;
}

pn_status bad_utf8(const char *op, const char *what, const char *s, int64_t n, int64_t at) {
    return pn_error(PN_ERR_ARG, "%s: %s is not valid UTF-8 (byte 0x%02x at byte offset %lld of %lld)", op, what,
                    (unsigned)(unsigned char)s[at], (long long)at, (long long)n);
}

/* a malloc'd copy, never NULL for success (an empty result is 1 byte) */
template <class T> T *malloc_copy(const T *src, size_t n) {
    T *p = (T *)malloc(n ? n * sizeof(T) : 1);
    if (p && n) memcpy(p, src, n * sizeof(T));
    return p;
}

/* The training text: every line of every file, in order (sentencepiece's SentenceIterator). */
class FileLines : public spm::SentenceIterator {
  public:
    FileLines(const char *const *paths, int n) : paths_(paths, paths + n) { open_next(); }
    bool done() const override { return done_; }
    void Next() override { read(); }
    const std::string &value() const override { return line_; }
    spm::util::Status status() const override { return status_; }
    int64_t lines() const { return lines_; }
    bool failed() const { return !status_.ok(); }

  private:
    void open_next() {
        while (file_ < paths_.size()) {
            in_.close();
            in_.clear();
            in_.open(paths_[file_], std::ios::in | std::ios::binary);
            if (!in_) {
                std::string m = "cannot read training file " + paths_[file_] + ": " + strerror(errno);
                status_ = spm::util::Status(spm::util::StatusCode::kNotFound, m);
                done_ = true;
                return;
            }
            if (read_line()) return;
            file_++;
        }
        done_ = true;
    }
    bool read_line() {
        if (std::getline(in_, line_)) {
            lines_++;
            return true;
        }
        if (in_.bad()) {
            std::string m = "error reading training file " + paths_[file_];
            status_ = spm::util::Status(spm::util::StatusCode::kDataLoss, m);
            done_ = true;
            return true;
        }
        return false;
    }
    void read() {
        if (done_) return;
        if (read_line()) return;
        file_++;
        open_next();
    }

    std::vector<std::string> paths_;
    size_t file_ = 0;
    std::ifstream in_;
    std::string line_;
    int64_t lines_ = 0;
    bool done_ = false;
    spm::util::Status status_;
};

std::string file_list(const char *const *inputs, int n) {
    std::string s;
    for (int i = 0; i < n; i++) {
        if (i) s += ", ";
        s += inputs[i];
    }
    return s;
}

/* sentencepiece's message without its "./src/file.cc(123) [condition] " prefix; when nothing
 * follows the prefix, `fallback` (the condition alone says little to a user) */
std::string clean(const char *msg, const char *fallback) {
    std::string m = msg ? msg : "";
    if (m.rfind("./src/", 0) == 0 || m.rfind("src/", 0) == 0) {
        size_t at = m.find(") [");
        size_t end = at == std::string::npos ? std::string::npos : m.find("] ", at);
        if (end == std::string::npos && at != std::string::npos && m.size() && m.back() == ']') end = m.size() - 1;
        if (end != std::string::npos) m = end + 2 <= m.size() ? m.substr(end + 2) : std::string();
    }
    while (!m.empty() && (m.back() == ' ' || m.back() == '\n')) m.pop_back();
    return m.empty() ? std::string(fallback) : m;
}

int threads_or_default(int t) { return t > 0 ? t : pn_num_threads(); }

/* ---- SHA-256 (FIPS 180-4), for the tokenizer cache keys ---------------------------------- */
struct Sha256 {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    unsigned char buf[64];
    size_t nbuf = 0;
    uint64_t total = 0;

    static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
    void block(const unsigned char *p) {
        static const uint32_t K[64] = {
            0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
            0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
            0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
            0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
            0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
            0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
            0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
            0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
        uint32_t w[64];
        for (int i = 0; i < 16; i++)
            w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
        for (int i = 16; i < 64; i++) {
            uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
            uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
        for (int i = 0; i < 64; i++) {
            uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
            uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
        }
        h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
    }
    void update(const void *data, size_t n) {
        const unsigned char *p = (const unsigned char *)data;
        total += n;
        if (nbuf) {
            size_t k = 64 - nbuf < n ? 64 - nbuf : n;
            memcpy(buf + nbuf, p, k);
            nbuf += k; p += k; n -= k;
            if (nbuf == 64) { block(buf); nbuf = 0; }
        }
        for (; n >= 64; p += 64, n -= 64) block(p);
        if (n) { memcpy(buf, p, n); nbuf = n; }
    }
    void hex(char out[65]) {
        uint64_t bits = total * 8;
        unsigned char pad = 0x80;
        update(&pad, 1);
        unsigned char zero = 0;
        while (nbuf != 56) update(&zero, 1);
        unsigned char len[8];
        for (int i = 0; i < 8; i++) len[i] = (unsigned char)(bits >> (56 - 8 * i));
        update(len, 8);
        for (int i = 0; i < 8; i++) snprintf(out + 8 * i, 9, "%08x", h[i]);
        out[64] = 0;
    }
};

} // namespace

/* ---- the C interface ---------------------------------------------------------------------- */
extern "C" {

pn_status pn_sha256_hex(const void *data, int64_t len, char *out) {
    if (!out || (!data && len > 0) || len < 0) return pn_error(PN_ERR_ARG, "sha256: NULL output or data, or negative length");
    Sha256 s;
    s.update(data, (size_t)len);
    s.hex(out);
    return PN_OK;
}

pn_status pn_sha256_file(const char *path, char *out) {
    if (!path || !out) return pn_error(PN_ERR_ARG, "sha256: NULL path or output");
    FILE *f = fopen(path, "rb");
    if (!f) return pn_error(PN_ERR_IO, "sha256: cannot read %s: %s", path, strerror(errno));
    errno = 0;
    Sha256 s;
    std::vector<unsigned char> buf(1 << 16);
    size_t k;
    while ((k = fread(buf.data(), 1, buf.size(), f)) > 0) s.update(buf.data(), k);
    bool err = ferror(f);
    int e = errno;
    fclose(f);
    if (err) return pn_error(PN_ERR_IO, "sha256: cannot read %s: %s", path, e ? strerror(e) : "read error");
    s.hex(out);
    return PN_OK;
}

#ifndef PN_SPM_VERSION
#define PN_SPM_VERSION "unknown"
#endif
const char *pn_spm_version(void) { return PN_SPM_VERSION; }

pn_status pn_spm_train(const char *const *inputs, int ninputs, const char *model_prefix, int vocab_size,
                       double character_coverage, int num_threads) {
    static const char *OP = "bpe_train";
    if (!inputs || ninputs <= 0) return pn_error(PN_ERR_ARG, "%s: no training files given", OP);
    for (int i = 0; i < ninputs; i++)
        if (!inputs[i] || !inputs[i][0]) return pn_error(PN_ERR_ARG, "%s: training file %d is NULL or empty", OP, i + 1);
    if (!model_prefix || !model_prefix[0]) return pn_error(PN_ERR_ARG, "%s: model_prefix is NULL or empty", OP);
    if (vocab_size < 5) /* the 4 special pieces and at least one character */
        return pn_error(PN_ERR_ARG, "%s: vocab size %d is too small (at least 5: pad, unk, bos, eos and one character)",
                        OP, vocab_size);
    if (!(character_coverage > 0 && character_coverage <= 1))
        return pn_error(PN_ERR_ARG, "%s: character_coverage must be in (0, 1], got %g", OP, character_coverage);
    /* every file readable before sentencepiece starts (its message would name no file) */
    for (int i = 0; i < ninputs; i++) {
        FILE *f = fopen(inputs[i], "rb");
        if (!f) return pn_error(PN_ERR_IO, "%s: cannot read training file %s: %s", OP, inputs[i], strerror(errno));
        fclose(f);
    }
    try {
        char cov[32], vs[32], th[32];
        snprintf(cov, sizeof cov, "%.17g", character_coverage);
        snprintf(vs, sizeof vs, "%d", vocab_size);
        snprintf(th, sizeof th, "%d", threads_or_default(num_threads));
        const std::unordered_map<std::string, std::string> kw = {
            {"model_prefix", model_prefix},
            {"model_type", "bpe"},
            {"vocab_size", vs},
            {"character_coverage", cov},
            {"num_threads", th},
            {"pad_id", "0"},
            {"unk_id", "1"},
            {"bos_id", "2"},
            {"eos_id", "3"},
            {"input_sentence_size", "0"},        /* every sentence */
            {"shuffle_input_sentence", "false"}, /* in file order */
            {"minloglevel", "2"},                /* errors only */
        };
        FileLines it(inputs, ninputs);
        spm::util::Status st = spm::SentencePieceTrainer::Train(kw, &it);
        if (it.failed()) return pn_error(PN_ERR_IO, "%s: %s", OP, it.status().message());
        if (st.ok()) return PN_OK;
        const std::string raw = st.message();
        const std::string files = file_list(inputs, ninputs);
        if (raw.find("sentences_.empty()") != std::string::npos || it.lines() == 0)
            return pn_error(PN_ERR_ARG, "%s: the training files %s contain no sentences (%lld lines read)", OP,
                            files.c_str(), (long long)it.lines());
        const std::string m = clean(raw.c_str(), "no message");
        if (m.find("Vocabulary size too high") != std::string::npos)
            return pn_error(PN_ERR_ARG, "%s: vocab size %d is too high for the training text %s (sentencepiece: %s)", OP,
                            vocab_size, files.c_str(), m.c_str());
        if (m.find("smaller than required_chars") != std::string::npos)
            return pn_error(PN_ERR_ARG, "%s: vocab size %d is too small for the characters of %s (sentencepiece: %s)", OP,
                            vocab_size, files.c_str(), m.c_str());
        return pn_error(PN_ERR_IO, "%s: training on %s with vocab size %d failed (sentencepiece: %s)", OP, files.c_str(),
                        vocab_size, m.c_str());
    } catch (const std::bad_alloc &) {
        return pn_error(PN_ERR_OOM, "%s: out of memory while training on %s", OP, file_list(inputs, ninputs).c_str());
    } catch (const std::exception &e) {
        return pn_error(PN_ERR_STATE, "%s: sentencepiece threw: %s", OP, e.what());
    } catch (...) {
        return pn_error(PN_ERR_STATE, "%s: sentencepiece threw an unknown exception", OP);
    }
}

pn_spm *pn_spm_load(const char *path) {
    static const char *OP = "bpe_load";
    if (!path || !path[0]) return (pn_spm *)pn_error_null(PN_ERR_ARG, "%s: model path is NULL or empty", OP);
    FILE *f = fopen(path, "rb");
    if (!f) return (pn_spm *)pn_error_null(PN_ERR_IO, "%s: cannot read model %s: %s", OP, path, strerror(errno));
    int c = fgetc(f);
    fclose(f);
    if (c == EOF) /* an empty file parses as an empty proto */
        return (pn_spm *)pn_error_null(PN_ERR_IO, "%s: %s is empty, not a sentencepiece model", OP, path);
    pn_spm *s = nullptr;
    try {
        s = new pn_spm();
        s->path = path;
        spm::util::Status st = s->sp.Load(path);
        if (!st.ok()) {
            std::string m = clean(st.message(), "the file does not parse as a ModelProto");
            delete s;
            return (pn_spm *)pn_error_null(PN_ERR_IO, "%s: %s is not a sentencepiece model (sentencepiece: %s)", OP, path,
                                           m.c_str());
        }
        if (s->sp.GetPieceSize() <= 0) {
            delete s;
            return (pn_spm *)pn_error_null(PN_ERR_IO, "%s: %s is not a sentencepiece model (it has no pieces)", OP, path);
        }
        return s;
    } catch (const std::bad_alloc &) {
        delete s;
        return (pn_spm *)pn_error_null(PN_ERR_OOM, "%s: out of memory loading %s", OP, path);
    } catch (const std::exception &e) {
        delete s;
        return (pn_spm *)pn_error_null(PN_ERR_IO, "%s: %s is not a sentencepiece model (sentencepiece threw: %s)", OP,
                                       path, e.what());
    } catch (...) {
        delete s;
        return (pn_spm *)pn_error_null(PN_ERR_IO, "%s: %s is not a sentencepiece model", OP, path);
    }
}

void pn_spm_free(pn_spm *s) { delete s; }
void pn_spm_buf_free(void *p) { free(p); }

int pn_spm_piece_size(const pn_spm *s) { return s ? s->sp.GetPieceSize() : -1; }
int pn_spm_unk_id(const pn_spm *s) { return s ? s->sp.unk_id() : -1; }
int pn_spm_bos_id(const pn_spm *s) { return s ? s->sp.bos_id() : -1; }
int pn_spm_eos_id(const pn_spm *s) { return s ? s->sp.eos_id() : -1; }
int pn_spm_pad_id(const pn_spm *s) { return s ? s->sp.pad_id() : -1; }

const char *pn_spm_id_to_piece(const pn_spm *s, int id) {
    if (!s) return (const char *)pn_error_null(PN_ERR_ARG, "bpe_piece: NULL model");
    int n = s->sp.GetPieceSize();
    if (id < 0 || id >= n)
        return (const char *)pn_error_null(PN_ERR_INDEX, "bpe_piece: id %d is out of range [0, %d) of %s", id, n,
                                           s->path.c_str());
    return s->sp.IdToPiece(id).c_str(); /* lives in the model */
}

int pn_spm_piece_to_id(const pn_spm *s, const char *piece) {
    if (!s || !piece) return -1;
    try {
        return s->sp.PieceToId(piece); /* unk id when unknown */
    } catch (...) {
        return -1;
    }
}

int32_t *pn_spm_encode_batch(const pn_spm *s, const char *const *lines, const int64_t *lens, int64_t n, int64_t *offsets,
                             int num_threads) {
    static const char *OP = "bpe_encode_lines";
    if (!s || (!lines && n > 0) || (!lens && n > 0) || !offsets || n < 0)
        return (int32_t *)pn_error_null(PN_ERR_ARG, "%s: NULL model, lines, lengths or offsets, or negative count", OP);
    offsets[0] = 0;
    /* check every line before the parallel part: the first bad one is the error */
    for (int64_t i = 0; i < n; i++) {
        if (!lines[i] && lens[i] > 0) return (int32_t *)pn_error_null(PN_ERR_ARG, "%s: line %lld is NULL", OP, (long long)i + 1);
        if (lens[i] < 0) return (int32_t *)pn_error_null(PN_ERR_ARG, "%s: line %lld has a negative length", OP, (long long)i + 1);
        int64_t bad = utf8_invalid_at(lines[i], lens[i]);
        if (bad >= 0) {
            char what[48];
            snprintf(what, sizeof what, "line %lld", (long long)i + 1);
            bad_utf8(OP, what, lines[i], lens[i], bad);
            return nullptr;
        }
    }
    try {
        std::vector<std::vector<int>> ids((size_t)n);
        std::vector<std::string> errs((size_t)n);
        int nt = threads_or_default(num_threads);
        if (n < 64) nt = 1;
#pragma omp parallel for schedule(dynamic, 32) num_threads(nt)
        for (int64_t i = 0; i < n; i++) {
            try {
                spm::util::Status st = s->sp.Encode(absl::string_view(lines[i], (size_t)lens[i]), &ids[(size_t)i]);
                if (!st.ok()) errs[(size_t)i] = clean(st.message(), "failed");
            } catch (const std::exception &e) {
                errs[(size_t)i] = std::string("threw: ") + e.what();
            } catch (...) {
                errs[(size_t)i] = "threw an unknown exception";
            }
        }
        for (int64_t i = 0; i < n; i++)
            if (!errs[(size_t)i].empty())
                return (int32_t *)pn_error_null(PN_ERR_STATE, "%s: line %lld: sentencepiece: %s", OP, (long long)i + 1,
                                                errs[(size_t)i].c_str());
        for (int64_t i = 0; i < n; i++) offsets[i + 1] = offsets[i] + (int64_t)ids[(size_t)i].size();
        int64_t total = offsets[n];
        int32_t *p = (int32_t *)malloc(total ? (size_t)total * sizeof(int32_t) : 1);
        if (!p) return (int32_t *)pn_error_null(PN_ERR_OOM, "%s: out of memory for %lld ids", OP, (long long)total);
        for (int64_t i = 0; i < n; i++) {
            const std::vector<int> &v = ids[(size_t)i];
            for (size_t k = 0; k < v.size(); k++) p[offsets[i] + (int64_t)k] = v[k];
        }
        return p;
    } catch (const std::bad_alloc &) {
        return (int32_t *)pn_error_null(PN_ERR_OOM, "%s: out of memory encoding %lld lines", OP, (long long)n);
    } catch (const std::exception &e) {
        return (int32_t *)pn_error_null(PN_ERR_STATE, "%s: %s", OP, e.what());
    }
}

char *pn_spm_encode_pieces(const pn_spm *s, const char *text, int64_t len, int64_t *len_out) {
    static const char *OP = "bpe_pieces";
    if (!s || !len_out || (!text && len > 0) || len < 0)
        return (char *)pn_error_null(PN_ERR_ARG, "%s: NULL model, text or length, or negative length", OP);
    *len_out = 0;
    int64_t bad = utf8_invalid_at(text, len);
    if (bad >= 0) {
        bad_utf8(OP, "the text", text, len, bad);
        return nullptr;
    }
    try {
        std::vector<std::string> pieces;
        spm::util::Status st = s->sp.Encode(absl::string_view(text, (size_t)len), &pieces);
        if (!st.ok())
            return (char *)pn_error_null(PN_ERR_STATE, "%s: sentencepiece: %s", OP, clean(st.message(), "failed").c_str());
        std::string joined;
        for (size_t i = 0; i < pieces.size(); i++) {
            if (i) joined.push_back('\0');
            joined += pieces[i];
        }
        char *p = malloc_copy(joined.data(), joined.size());
        if (!p) return (char *)pn_error_null(PN_ERR_OOM, "%s: out of memory", OP);
        *len_out = (int64_t)joined.size();
        return p;
    } catch (const std::exception &e) {
        return (char *)pn_error_null(PN_ERR_STATE, "%s: %s", OP, e.what());
    } catch (...) {
        return (char *)pn_error_null(PN_ERR_STATE, "%s: sentencepiece threw an unknown exception", OP);
    }
}

char *pn_spm_decode(const pn_spm *s, const int32_t *ids, int64_t n, int64_t *len_out) {
    static const char *OP = "bpe_decode";
    if (!s || !len_out || (!ids && n > 0) || n < 0)
        return (char *)pn_error_null(PN_ERR_ARG, "%s: NULL model, ids or length, or negative count", OP);
    *len_out = 0;
    const int size = s->sp.GetPieceSize();
    const int pad = s->sp.pad_id(), bos = s->sp.bos_id(), eos = s->sp.eos_id();
    try {
        std::vector<int> keep;
        keep.reserve((size_t)n);
        for (int64_t i = 0; i < n; i++) {
            int32_t id = ids[i];
            if (id < 0 || id >= size)
                return (char *)pn_error_null(PN_ERR_INDEX, "%s: id %d at position %lld is out of range [0, %d) of %s", OP,
                                             (int)id, (long long)i + 1, size, s->path.c_str());
            if (id == pad || id == bos || id == eos) continue;
            keep.push_back(id);
        }
        std::string text;
        spm::util::Status st = s->sp.Decode(keep, &text);
        if (!st.ok())
            return (char *)pn_error_null(PN_ERR_STATE, "%s: sentencepiece: %s", OP, clean(st.message(), "failed").c_str());
        char *p = malloc_copy(text.data(), text.size());
        if (!p) return (char *)pn_error_null(PN_ERR_OOM, "%s: out of memory", OP);
        *len_out = (int64_t)text.size();
        return p;
    } catch (const std::exception &e) {
        return (char *)pn_error_null(PN_ERR_STATE, "%s: %s", OP, e.what());
    } catch (...) {
        return (char *)pn_error_null(PN_ERR_STATE, "%s: sentencepiece threw an unknown exception", OP);
    }
}

} // extern "C"
