#include "CCrypto.h"

#include <openssl/evp.h>

int fd_sha256(const void *bytes, size_t length, uint8_t digest[32]) {
    unsigned int written = 0;
    return EVP_Digest(bytes, length, digest, &written, EVP_sha256(), NULL) == 1 && written == 32;
}
