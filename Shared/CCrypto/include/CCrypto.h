#ifndef C_CRYPTO_SHIM_H
#define C_CRYPTO_SHIM_H

#include <stddef.h>
#include <stdint.h>

/// SHA-256 of `length` bytes into `digest` (32 bytes), by OpenSSL's libcrypto. 0 on failure.
int fd_sha256(const void *bytes, size_t length, uint8_t digest[32]);

#endif
