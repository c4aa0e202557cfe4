#include "CCrypto.h"

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/ecdsa.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <stdio.h>
#include <stdlib.h>

int fd_sha256(const void *bytes, size_t length, uint8_t digest[32]) {
    unsigned int written = 0;
    return EVP_Digest(bytes, length, digest, &written, EVP_sha256(), NULL) == 1 && written == 32;
}

static int no_passphrase(char *buffer, int size, int rwflag, void *user) {
    (void)buffer;
    (void)size;
    (void)rwflag;
    (void)user;
    return 0;
}

struct fd_es256_key {
    EVP_PKEY *pkey;
};

fd_es256_key *fd_es256_key_load(const char *path, char *error, size_t error_len) {
    FILE *file = fopen(path, "r");
    if (file == NULL) {
        snprintf(error, error_len, "cannot open the key file");
        return NULL;
    }
    // No passphrase callback: an encrypted key is refused, never prompted for on a terminal.
    EVP_PKEY *pkey = PEM_read_PrivateKey(file, NULL, no_passphrase, NULL);
    fclose(file);
    if (pkey == NULL) {
        snprintf(error, error_len, "the key file holds no PEM private key");
        return NULL;
    }
    if (EVP_PKEY_get_base_id(pkey) != EVP_PKEY_EC || EVP_PKEY_get_bits(pkey) != 256) {
        EVP_PKEY_free(pkey);
        snprintf(error, error_len, "the key is not an EC P-256 key (APNs keys are)");
        return NULL;
    }
    fd_es256_key *key = calloc(1, sizeof *key);
    if (key == NULL) {
        EVP_PKEY_free(pkey);
        snprintf(error, error_len, "out of memory");
        return NULL;
    }
    key->pkey = pkey;
    return key;
}

void fd_es256_key_free(fd_es256_key *key) {
    if (key == NULL) return;
    EVP_PKEY_free(key->pkey);
    free(key);
}

int fd_es256_sign(const fd_es256_key *key, const void *message, size_t length, uint8_t signature[64]) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx == NULL) return 0;
    unsigned char der[128];
    size_t der_len = sizeof der;
    int ok = EVP_DigestSignInit(ctx, NULL, EVP_sha256(), NULL, key->pkey) == 1 &&
             EVP_DigestSign(ctx, der, &der_len, message, length) == 1;
    EVP_MD_CTX_free(ctx);
    if (!ok) return 0;
    const unsigned char *p = der;
    ECDSA_SIG *sig = d2i_ECDSA_SIG(NULL, &p, (long)der_len);
    if (sig == NULL) return 0;
    const BIGNUM *r = NULL, *s = NULL;
    ECDSA_SIG_get0(sig, &r, &s);
    ok = BN_bn2binpad(r, signature, 32) == 32 && BN_bn2binpad(s, signature + 32, 32) == 32;
    ECDSA_SIG_free(sig);
    return ok;
}
