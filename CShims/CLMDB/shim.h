#ifndef STASH_CLMDB_SHIM_H
#define STASH_CLMDB_SHIM_H
// The system liblmdb (Debian: liblmdb-dev, pkg-config `lmdb`). Never vendored.
#include <lmdb.h>
#endif
