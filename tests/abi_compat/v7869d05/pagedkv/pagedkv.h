/* pagedkv.h: the umbrella header of the pagedkv C ABI.
 *
 * Include this one file. Stable section: everything declared under
 * pagedkv/ below. Conventions are in docs/conventions.md.
 */
#ifndef PAGEDKV_H
#define PAGEDKV_H

#include "pagedkv/batch.h"
#include "pagedkv/common.h"
#include "pagedkv/events.h"
#include "pagedkv/groups.h"
#include "pagedkv/hash.h"
#include "pagedkv/pool.h"
#include "pagedkv/tiers.h"
#include "pagedkv/transfer.h"

#endif /* PAGEDKV_H */
