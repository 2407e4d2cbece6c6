/* Run on the glibc of RHEL 8 (2.28) though built on a newer one.
 *
 * glibc 2.34 moved the pthread functions into libc and gave pthread_create and
 * pthread_join a new symbol version, GLIBC_2.34: a library linked against it cannot be
 * loaded by an older glibc, and the collective library then runs without the plugin.
 * The libc of 2.34 and later still defines the old versions, so binding our two calls to
 * them keeps the library loadable everywhere (libpthread.so.0 provides them before
 * 2.34; the Makefile links it). Sanitizer builds, which are never shipped, keep the
 * default binding: their runtimes intercept the unversioned names. */
#ifndef RAILOVER_GLIBC_COMPAT_H
#define RAILOVER_GLIBC_COMPAT_H

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34)) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#if defined(__x86_64__)
#define RAILOVER_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define RAILOVER_GLIBC_BASE "GLIBC_2.17"
#endif
#ifdef RAILOVER_GLIBC_BASE
__asm__(".symver pthread_create,pthread_create@" RAILOVER_GLIBC_BASE);
__asm__(".symver pthread_join,pthread_join@" RAILOVER_GLIBC_BASE);
#endif
#endif

#endif /* RAILOVER_GLIBC_COMPAT_H */
