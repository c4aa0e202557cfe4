#ifndef C_CRYPTO_SHIM_H
#define C_CRYPTO_SHIM_H

#include <stddef.h>
#include <stdint.h>

/// SHA-256 of `length` bytes into `digest` (32 bytes), by OpenSSL's libcrypto. 0 on failure.
int fd_sha256(const void *bytes, size_t length, uint8_t digest[32]);

/// An EC P-256 private key (APNs' .p8: PKCS#8 PEM), for ES256.
typedef struct fd_es256_key fd_es256_key;

/// Loads the key; NULL with a reason in `error` (never the key's bytes).
fd_es256_key *fd_es256_key_load(const char *path, char *error, size_t error_len);

void fd_es256_key_free(fd_es256_key *key);

/// ES256 of `message`: the raw 64-byte r || s that a JWT carries. 0 on failure.
int fd_es256_sign(const fd_es256_key *key, const void *message, size_t length, uint8_t signature[64]);

#endif
