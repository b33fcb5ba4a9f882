/* pagedkv.h: the umbrella header of the pagedkv C ABI.
 *
 * Include this one file. Stable section: everything declared under
 * pagedkv/ below. Conventions are in docs/conventions.md.
 */
#ifndef PAGEDKV_H
#define PAGEDKV_H

#include "pagedkv/common.h"
#include "pagedkv/hash.h"
#include "pagedkv/pool.h"
#include "pagedkv/batch.h"

#endif /* PAGEDKV_H */
