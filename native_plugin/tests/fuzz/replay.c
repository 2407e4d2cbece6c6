/* Runs a libFuzzer target over files, without libFuzzer: each argument is a corpus
 * file or a directory of them. Used by `make test` (gcc, ASan+UBSan) to replay the
 * committed corpus; a failing input aborts with the target's message. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static int run_file(const char* path) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    exit(1);
  }
  static uint8_t buf[1 << 20];
  size_t n = fread(buf, 1, sizeof(buf), f);
  fclose(f);
  LLVMFuzzerTestOneInput(buf, n);
  return 1;
}

int main(int argc, char** argv) {
  int inputs = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: no %s\n", argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      inputs += run_file(argv[i]);
      continue;
    }
    DIR* d = opendir(argv[i]);
    struct dirent* e;
    while (d && (e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.') continue;
      char path[4096];
      snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
      inputs += run_file(path);
    }
    if (d) closedir(d);
  }
  if (inputs == 0) {
    fprintf(stderr, "replay: no inputs\n");
    return 1;
  }
  printf("replayed %d inputs: ok\n", inputs);
  return 0;
}
