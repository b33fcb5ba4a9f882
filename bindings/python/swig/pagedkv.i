/* SWIG interface of the raw module pagedkv._pagedkv: every declaration of the
 * public C headers, wrapped through typemaps only. The pagedkv package builds
 * the Pythonic API on top of it.
 *
 * Conventions of the raw module:
 *  - a pkv_status return never reaches Python: PKV_OK becomes the call's
 *    outputs (or None), a negative code raises the exception class registered
 *    for it, carrying the message pkv_last_error_copy gave in the same call;
 *  - out-parameters disappear from the signature and are returned (several
 *    as a list, in declaration order);
 *  - (buffer, capacity, &len) outputs take the capacity and return a list;
 *  - int arrays come from anything with the buffer protocol (one memcpy when
 *    it is contiguous int32) or any sequence of ints, always into memory of
 *    the call's own (no other thread can change them while it runs);
 *  - option structs are taken as their proxy object, None (NULL) or a dict of
 *    field names; string and multimodal fields can only be set through the
 *    dict (they are borrowed for the call, so nothing dangles or leaks);
 *  - tensors are a pkv_tensor proxy or the tuple
 *    (data, byte_offset, dtype, device_type, device_id, shape, strides);
 *  - void* (data, streams) is None or an int address;
 *  - the GIL is released around every call that takes the pool lock, runs a
 *    kernel, hashes or allocates (the %thread list below).
 */
%module(package="pagedkv", docstring="Raw SWIG bindings of the pagedkv C ABI (use the pagedkv package).") _pagedkv

%{
#include <stdlib.h>
#include <string.h>
#include <structmember.h>
#include "pagedkv/pagedkv.h"
%}

%include <stdint.i>

/* Signatures in the raw functions' docstrings. */
%feature("autodoc", "1");

/* ------------------------------------------------------------ GIL policy */

/* Built with -threads; accessors and constant-time calls keep the GIL. */
%nothread;
%thread pkv_pool_create;
%thread pkv_pool_destroy;
%thread pkv_pool_get_options;
%thread pkv_pool_bytes_per_block;
%thread pkv_seq_create;
%thread pkv_seq_match_prefix;
%thread pkv_seq_append;
%thread pkv_seq_blocks_needed;
%thread pkv_seq_fork;
%thread pkv_seq_truncate;
%thread pkv_seq_reserve;
%thread pkv_seq_free;
%thread pkv_seq_get_info;
%thread pkv_seq_get_block_table;
%thread pkv_pool_create_groups;
%thread pkv_seq_group_block_table;
%thread pkv_pool_group_of_layer;
%thread pkv_pool_group_stats;
%thread pkv_pool_group_take_copies;
%thread pkv_seq_get_block_hashes;
%thread pkv_pool_get_stats;
%thread pkv_pool_drain_events;
%thread pkv_pool_reset_prefix_cache;
%thread pkv_pool_validate;
%thread pkv_pool_kv_tensor;
%thread pkv_pool_copy_blocks;
%thread pkv_pool_swap_blocks;
%thread pkv_pool_set_kv_scales;
%thread pkv_pool_get_kv_scales;
%thread pkv_batch_prepare;
%thread pkv_batch_prepare_ex;
%thread pkv_batch_prepare_decode;
%thread pkv_batch_destroy;
%thread pkv_batch_commit;
%thread pkv_batch_abort;
%thread pkv_batch_get_info;
%thread pkv_batch_plan_tensor;
%thread pkv_batch_plan_tensor_group;
%thread pkv_cache_write;
%thread pkv_attention_forward;
%thread pkv_hash_prefix;
%thread pkv_hash_root;
%thread pkv_cuda_device_count;
%thread pkv_seq_match_prefix_partial;
%thread pkv_seq_set_retention;
%thread pkv_pool_set_clock;
%thread pkv_pool_get_priority_counts;
%thread pkv_seq_append_batch;
%thread pkv_seq_free_batch;
%thread pkv_pool_drain_events_v2;
%thread pkv_event_publisher_create;
%thread pkv_event_publisher_publish;
%thread pkv_event_publisher_destroy;
%thread pkv_seq_admit;
%thread pkv_seq_match_prefix_hashes;
%thread pkv_seq_admit_hashes;
%thread pkv_mla_cache_write;
%thread pkv_mla_attention;
%thread pkv_pool_attach_tiers;
%thread pkv_seq_match_prefix_tiered;
%thread pkv_seq_match_prefix_hashes_tiered;
%thread pkv_seq_admit_tiered;
%thread pkv_pool_get_tier_stats;
%thread pkv_pool_flush_tiers;
%thread pkv_transfer_engine_create;
%thread pkv_transfer_engine_destroy;
%thread pkv_transfer_engine_progress;
%thread pkv_transfer_export;
%thread pkv_transfer_export_release;
%thread pkv_transfer_import;
%thread pkv_transfer_poll;
%thread pkv_transfer_cancel;
%thread pkv_transfer_destroy;

/* --------------------------------------------------------- status -> raise */

%{
#define PKV_PY_MAX_CODE 64
static PyObject* pkv_py_error_classes[PKV_PY_MAX_CODE + 1];

/* Raises the class registered for status with the message of the failed call
 * (thread-local in the library; read on the thread that made the call, before
 * any other pagedkv call can replace it). */
static void pkv_py_raise(pkv_status status) {
  char small[512];
  char* text = small;
  uint64_t n = pkv_last_error_copy(small, sizeof small);
  if (n >= sizeof small) {
    char* big = (char*)malloc((size_t)n + 1);
    if (big) {
      n = pkv_last_error_copy(big, n + 1);
      text = big;
    } else {
      n = sizeof small - 1;
    }
  }
  if (n == 0) {
    text = (char*)pkv_status_string(status);
    n = strlen(text);
  }
  PyObject* msg = PyUnicode_DecodeUTF8(text, (Py_ssize_t)n, "replace");
  if (text != small && text != pkv_status_string(status)) free(text);
  if (!msg) return;
  int idx = status < 0 ? -status : 0;
  PyObject* cls = idx <= PKV_PY_MAX_CODE ? pkv_py_error_classes[idx] : NULL;
  if (!cls) cls = pkv_py_error_classes[0];
  if (!cls) {
    PyErr_Format(PyExc_RuntimeError, "pagedkv status %d: %U", (int)status, msg);
    Py_DECREF(msg);
    return;
  }
  PyObject* exc = PyObject_CallFunction(cls, "Oi", msg, (int)status);
  Py_DECREF(msg);
  if (!exc) return;
  PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
  Py_DECREF(exc);
}
%}

%typemap(out) pkv_status {
  if ($1 != PKV_OK) {
    pkv_py_raise($1);
    SWIG_fail;
  }
  $result = SWIG_Py_Void();
}

/* Registers the exception class raised for a status code (0 = fallback).
 * Called once by the Python part of this module. */
%inline %{
void _pkv_register_error(int32_t status, PyObject* cls) {
  int idx = status < 0 ? -status : status;
  if (idx > PKV_PY_MAX_CODE) return;
  Py_XINCREF(cls);
  Py_XDECREF(pkv_py_error_classes[idx]);
  pkv_py_error_classes[idx] = cls;
}
%}

/* ---------------------------------------------------- pinned handles */

/* _Handle: a C handle shared by the package's Python objects (Pool, Batch,
 * views of their memory). It counts the owner's reference plus one per call
 * in flight and per live view; close() drops the owner's and makes new pins
 * fail; the handle is destroyed when the last reference goes, so a call
 * racing close() on another thread never sees freed memory. A handle passed
 * where the C function takes its pointer is pinned by the argument typemap
 * for the duration of the call: the counting happens in C while the GIL is
 * held (a Python-side lock cost more than the call itself). */
%{
typedef struct {
  PyObject_HEAD
  PyObject* ptr;     /* the SWIG pointer object; NULL once destroyed */
  PyObject* destroy; /* callable taking ptr */
  PyObject* what;    /* "pool", "batch": for the closed message */
  void* raw;
  swig_type_info* ty;
  Py_ssize_t refs;
  int closed;
} pkv_py_handle;

static PyTypeObject pkv_py_handle_type;

static void pkv_py_handle_destroy(pkv_py_handle* h) {
  PyObject* ptr = h->ptr;
  h->ptr = NULL;
  h->raw = NULL;
  if (!ptr) return;
  PyObject *et, *ev, *tb;
  PyErr_Fetch(&et, &ev, &tb);
  PyObject* r = h->destroy ? PyObject_CallOneArg(h->destroy, ptr) : NULL;
  Py_XDECREF(r);
  if (!r) PyErr_Clear();
  PyErr_Restore(et, ev, tb);
  Py_DECREF(ptr);
}

static int pkv_py_handle_pin(pkv_py_handle* h) {
  if (h->closed || !h->raw) {
    PyObject* cls = pkv_py_error_classes[-PKV_E_INVALID_STATE];
    PyObject* msg = PyUnicode_FromFormat("the %U is closed", h->what);
    PyObject* exc = cls && msg ? PyObject_CallFunction(cls, "Oi", msg, (int)PKV_E_INVALID_STATE) : NULL;
    Py_XDECREF(msg);
    if (exc) {
      PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
      Py_DECREF(exc);
    } else if (!PyErr_Occurred()) {
      PyErr_Format(PyExc_RuntimeError, "the %U is closed", h->what);
    }
    return 0;
  }
  ++h->refs;
  return 1;
}

static void pkv_py_handle_unpin(pkv_py_handle* h) {
  if (--h->refs == 0) pkv_py_handle_destroy(h);
}

/* The pointer of obj for a parameter of type ty: a pinned handle (*pin set)
 * or a raw SWIG pointer. */
/* destroy: the call is a *_destroy (PKV_PY_IS_DESTROY of its name, folded
 * by the compiler: a strstr here was a twentieth of a short call). */
#define PKV_PY_IS_DESTROY(fn) (__builtin_strstr(fn, "_destroy") != NULL)
static int pkv_py_handle_arg(PyObject* obj, swig_type_info* ty, const char* fn, int destroy,
                             int argnum, void** out, pkv_py_handle** pin) {
  if (Py_TYPE(obj) == &pkv_py_handle_type) {
    pkv_py_handle* h = (pkv_py_handle*)obj;
    if (destroy) {  /* the handle destroys its pointer itself */
      PyErr_Format(PyExc_TypeError, "%s: pass the raw pointer; a handle is released by close()", fn);
      return 0;
    }
    if (h->ty != ty) {
      PyErr_Format(PyExc_TypeError, "in method '%s', argument %d: a handle of another type", fn,
                   argnum);
      return 0;
    }
    if (!pkv_py_handle_pin(h)) return 0;
    *pin = h;
    *out = h->raw;
    return 1;
  }
  int res = SWIG_ConvertPtr(obj, out, ty, 0);
  if (!SWIG_IsOK(res)) {
    PyErr_Format(PyExc_TypeError, "in method '%s', argument %d of type '%s'", fn, argnum,
                 SWIG_TypePrettyName(ty));
    return 0;
  }
  return 1;
}

static pkv_py_handle* pkv_py_handle_make(PyTypeObject* type, PyObject* ptr, PyObject* destroy,
                                         PyObject* what) {
  SwigPyObject* sobj = SWIG_Python_GetSwigThis(ptr);
  if (!sobj || !sobj->ptr) {
    PyErr_SetString(PyExc_TypeError, "_Handle: expected a SWIG pointer");
    return NULL;
  }
  pkv_py_handle* h = (pkv_py_handle*)type->tp_alloc(type, 0);
  if (!h) return NULL;
  Py_INCREF(ptr);
  Py_INCREF(destroy);
  Py_INCREF(what);
  h->ptr = ptr;
  h->destroy = destroy;
  h->what = what;
  h->raw = sobj->ptr;
  h->ty = sobj->ty;
  h->refs = 1;
  h->closed = 0;
  return h;
}

static PyObject* pkv_py_handle_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
  PyObject *ptr, *destroy, *what;
  if (!PyArg_ParseTuple(args, "OOU:_Handle", &ptr, &destroy, &what)) return NULL;
  return (PyObject*)pkv_py_handle_make(type, ptr, destroy, what);
}

/* Calls destroy(ptr), keeping the error being raised. */
static void pkv_py_destroy_raw(PyObject* destroy, PyObject* ptr) {
  PyObject *et, *ev, *tb;
  PyErr_Fetch(&et, &ev, &tb);
  PyObject* r = PyObject_CallOneArg(destroy, ptr);
  if (r) {
    Py_DECREF(r);
  } else {
    PyErr_Clear();
  }
  PyErr_Restore(et, ev, tb);
}

/* _Handle._adopt(owner, destroy, what, fn, *args): fn(*args), a raw call
 * that makes a library object and returns its pointer, the _Handle owning
 * it and owner._h = that handle, in one C call; returns the handle. A
 * KeyboardInterrupt (any signal handler's exception) pending when the raw
 * call returns is raised by the interpreter at its next check, which in
 * Python code came between the raw call and `self._h = Handle(ptr, ...)`:
 * the pointer was dropped and the object (a pool's arena, a plan with its
 * step uncommitted, a running transfer holding pool blocks, an engine, an
 * event publisher's sockets) was never destroyed. No bytecode runs in
 * here: once the raw call returned, the owner owns the handle, and its
 * close()/__del__ releases it as it would any other (a Batch aborts its
 * step). A failure to make or store the handle destroys the pointer. */
static PyObject* pkv_py_handle_adopt(PyObject* cls, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 4 || !PyUnicode_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "_adopt(owner, destroy, what, fn, *args)");
    return NULL;
  }
  PyObject* ptr = PyObject_Vectorcall(args[3], args + 4, (size_t)(nargs - 4), NULL);
  if (!ptr) return NULL;
  pkv_py_handle* h = pkv_py_handle_make(&pkv_py_handle_type, ptr, args[1], args[2]);
  if (!h) {
    /* a pointer that cannot be held (not one: nothing to destroy) */
    SwigPyObject* sobj = SWIG_Python_GetSwigThis(ptr);
    if (sobj && sobj->ptr) pkv_py_destroy_raw(args[1], ptr);
    Py_DECREF(ptr);
    return NULL;
  }
  Py_DECREF(ptr);
  if (PyObject_SetAttrString(args[0], "_h", (PyObject*)h) < 0) {
    Py_DECREF(h); /* destroys the pointer */
    return NULL;
  }
  return (PyObject*)h;
}

static void pkv_py_handle_dealloc(pkv_py_handle* h) {
  pkv_py_handle_destroy(h); /* only if every owner forgot to close */
  Py_XDECREF(h->destroy);
  Py_XDECREF(h->what);
  Py_TYPE(h)->tp_free((PyObject*)h);
}

static PyObject* pkv_py_handle_acquire(pkv_py_handle* h, PyObject* unused) {
  if (!pkv_py_handle_pin(h)) return NULL;
  Py_INCREF(h->ptr);
  return h->ptr;
}

/* h._pin_into(owner): acquire() and owner._pin = h in one C call; returns
 * the pointer. A view made in Python after acquire() returned lost the pin
 * to an interrupt raised in between (the handle, a pool's storage, was then
 * never destroyed); owner (a TensorView) releases _pin when collected. */
static PyObject* pkv_py_handle_pin_into(pkv_py_handle* h, PyObject* owner) {
  if (!pkv_py_handle_pin(h)) return NULL;
  if (PyObject_SetAttrString(owner, "_pin", (PyObject*)h) < 0) {
    pkv_py_handle_unpin(h);
    return NULL;
  }
  Py_INCREF(h->ptr);
  return h->ptr;
}

static PyObject* pkv_py_handle_release(pkv_py_handle* h, PyObject* unused) {
  if (h->refs > 0) pkv_py_handle_unpin(h);
  Py_RETURN_NONE;
}

static PyObject* pkv_py_handle_close(pkv_py_handle* h, PyObject* unused) {
  if (!h->closed) {
    h->closed = 1;
    pkv_py_handle_unpin(h);
  }
  Py_RETURN_NONE;
}

static PyObject* pkv_py_handle_closed(pkv_py_handle* h, void* unused) {
  return PyBool_FromLong(h->closed);
}

/* _SeqBase: the C part of the package's Sequence handle (its pool, the
 * pool's _Handle, the id, freed/owned flags). Creation, free() and the
 * deallocation of an owned, not yet freed sequence run here in C: a Python
 * frame per call cost more than the pkv_seq_create / pkv_seq_free itself
 * (issue 16: the package within 2x of the raw SWIG call). */
typedef struct {
  PyObject_HEAD
  PyObject* pool; /* the package's Pool */
  PyObject* h;    /* the pool's _Handle */
  PyObject* id;   /* the pkv_seq_id, a Python int (read on every call) */
  char freed;
  char owned;
  PyObject* weakrefs;
} pkv_py_seq;

static PyTypeObject pkv_py_seq_type;

/* pkv_seq_free of an owned or explicit free, as the raw wrapper runs it
 * (handle pinned, GIL released). Returns the status; a closed pool is
 * PKV_E_INVALID_STATE without a call (closing released everything). */
static pkv_status pkv_py_seq_free_id(pkv_py_handle* h, PyObject* idobj) {
  if (h->closed || !h->raw) return PKV_E_INVALID_STATE;
  /* PyLong_AsUnsignedLongLong goes through _PyLong_AsByteArray for an int
   * of more than one digit (every seq id): a fifth of a free's C time */
#if ULONG_MAX == ULLONG_MAX
  unsigned long long id = PyLong_AsUnsignedLong(idobj);
#else
  unsigned long long id = PyLong_AsUnsignedLongLong(idobj);
#endif
  if (id == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    return PKV_E_NOT_FOUND;
  }
  pkv_status st;
  ++h->refs;
  Py_BEGIN_ALLOW_THREADS
  st = pkv_seq_free((pkv_pool*)h->raw, (pkv_seq_id)id);
  Py_END_ALLOW_THREADS
  pkv_py_handle_unpin(h);
  return st;
}

static int pkv_py_seq_traverse(pkv_py_seq* s, visitproc visit, void* arg) {
  Py_VISIT(s->pool);
  Py_VISIT(s->h);
  return 0;
}

static int pkv_py_seq_clear(pkv_py_seq* s) {
  Py_CLEAR(s->pool);
  return 0;
}

static void pkv_py_seq_dealloc(pkv_py_seq* s) {
  PyObject_GC_UnTrack((PyObject*)s);
  if (s->weakrefs) PyObject_ClearWeakRefs((PyObject*)s);
  if (s->owned && !s->freed && s->h && s->id && Py_TYPE(s->h) == &pkv_py_handle_type) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    /* stale (freed elsewhere) or a closed pool: nothing to do */
    (void)pkv_py_seq_free_id((pkv_py_handle*)s->h, s->id);
    PyErr_Restore(et, ev, tb);
  }
  PyTypeObject* tp = Py_TYPE(s);
  Py_CLEAR(s->pool);
  Py_CLEAR(s->h);
  Py_CLEAR(s->id);
  tp->tp_free((PyObject*)s);
}

static pkv_py_seq* pkv_py_seq_alloc(PyTypeObject* cls, PyObject* pool, PyObject* h, PyObject* id,
                                    int owned) {
  pkv_py_seq* s = (pkv_py_seq*)cls->tp_alloc(cls, 0);
  if (!s) return NULL;
  Py_INCREF(pool);
  s->pool = pool;
  Py_INCREF(h);
  s->h = h;
  s->id = id; /* stolen */
  s->owned = (char)owned;
  return s;
}

/* cls._make(pool, handle, id, owned): a handle without __init__'s
 * conversions, in one call (the package's fork, admit). */
static PyObject* pkv_py_seq_make(PyTypeObject* cls, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "_make(pool, handle, id, owned)");
    return NULL;
  }
  int owned = PyObject_IsTrue(args[3]);
  if (owned < 0) return NULL;
  Py_INCREF(args[2]);
  pkv_py_seq* s = pkv_py_seq_alloc(cls, args[0], args[1], args[2], owned);
  if (!s) Py_DECREF(args[2]);
  return (PyObject*)s;
}

/* cls._create(pool, handle, owned): pkv_seq_create with the C defaults and
 * the handle for it, in one call (the package's create_sequence). A closed
 * pool raises InvalidStateError, as the raw call does. */
static PyObject* pkv_py_seq_create(PyTypeObject* cls, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || Py_TYPE(args[1]) != &pkv_py_handle_type) {
    PyErr_SetString(PyExc_TypeError, "_create(pool, handle, owned)");
    return NULL;
  }
  int owned = PyObject_IsTrue(args[2]);
  if (owned < 0) return NULL;
  pkv_py_handle* h = (pkv_py_handle*)args[1];
  if (h->ty != SWIGTYPE_p_pkv_pool) {
    PyErr_SetString(PyExc_TypeError, "_create: handle is not a pool's");
    return NULL;
  }
  if (!pkv_py_handle_pin(h)) return NULL;
  pkv_seq_id id = 0;
  pkv_status st;
  Py_BEGIN_ALLOW_THREADS
  st = pkv_seq_create((pkv_pool*)h->raw, NULL, &id);
  Py_END_ALLOW_THREADS
  PyObject* idobj = NULL;
  if (st == PKV_OK) {
    idobj = PyLong_FromUnsignedLongLong((unsigned long long)id);
    if (!idobj) (void)pkv_seq_free((pkv_pool*)h->raw, id);
  }
  pkv_py_handle_unpin(h);
  if (st != PKV_OK) {
    pkv_py_raise(st);
    return NULL;
  }
  if (!idobj) return NULL;
  pkv_py_seq* s = pkv_py_seq_alloc(cls, args[0], args[1], idobj, owned);
  if (!s) {
    /* the handle may not free it now (pinned above, released): free by id */
    if (!h->closed && h->raw) (void)pkv_py_seq_free_id(h, idobj);
    Py_DECREF(idobj);
  }
  return (PyObject*)s;
}

/* cls._adopt(pool, handle, owned, fn, *args): fn(*args), a raw call that
 * makes a sequence and returns its id (or a tuple whose item 0 is the id),
 * and the handle for that id, in one C call; returns the handle (or the
 * tuple with item 0 replaced by it). A KeyboardInterrupt (any signal
 * handler's exception) pending when the raw call returns is raised by the
 * interpreter at its next check, which in Python code is between the raw
 * call and the handle's creation: the id was dropped, and the sequence and
 * its blocks stayed in the pool for good (admit, fork, create_sequence with
 * options). No bytecode runs in here, so once the raw call returned the id
 * has an owner; a failure to make the handle frees it. */
static PyObject* pkv_py_seq_adopt(PyTypeObject* cls, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 4 || Py_TYPE(args[1]) != &pkv_py_handle_type) {
    PyErr_SetString(PyExc_TypeError, "_adopt(pool, handle, owned, fn, *args)");
    return NULL;
  }
  int owned = PyObject_IsTrue(args[2]);
  if (owned < 0) return NULL;
  pkv_py_handle* h = (pkv_py_handle*)args[1];
  PyObject* r = PyObject_Vectorcall(args[3], args + 4, (size_t)(nargs - 4), NULL);
  if (!r) return NULL;
  /* a list or tuple (the raw admits' [id, cached]): the handle goes in
   * item 0 of a new tuple */
  int is_tuple = PyTuple_Check(r) || PyList_Check(r);
  PyObject* items = is_tuple ? PySequence_Tuple(r) : NULL;
  if (is_tuple && (!items || PyTuple_GET_SIZE(items) < 1)) {
    if (items) {
      PyErr_SetString(PyExc_TypeError, "_adopt: the call returned no sequence id");
    } else if (PyList_Check(r) && PyList_GET_SIZE(r) > 0 && PyLong_Check(PyList_GET_ITEM(r, 0))) {
      /* no memory for the tuple: the id still has no owner, free it */
      PyObject *et, *ev, *tb;
      PyErr_Fetch(&et, &ev, &tb);
      (void)pkv_py_seq_free_id(h, PyList_GET_ITEM(r, 0));
      PyErr_Restore(et, ev, tb);
    }
    Py_XDECREF(items);
    Py_DECREF(r);
    return NULL;
  }
  PyObject* idobj = is_tuple ? PyTuple_GET_ITEM(items, 0) : r;
  if (!PyLong_Check(idobj)) {
    Py_XDECREF(items);
    Py_DECREF(r);
    PyErr_SetString(PyExc_TypeError, "_adopt: the call returned no sequence id");
    return NULL;
  }
  Py_INCREF(idobj);
  PyObject* result = NULL;
  pkv_py_seq* s = pkv_py_seq_alloc(cls, args[0], args[1], idobj, owned); /* steals idobj */
  if (s) {
    if (!is_tuple) {
      result = (PyObject*)s;
    } else {
      Py_ssize_t n = PyTuple_GET_SIZE(items);
      result = PyTuple_New(n);
      if (result) {
        PyTuple_SET_ITEM(result, 0, (PyObject*)s);
        for (Py_ssize_t i = 1; i < n; ++i) {
          PyObject* item = PyTuple_GET_ITEM(items, i);
          Py_INCREF(item);
          PyTuple_SET_ITEM(result, i, item);
        }
      } else {
        Py_DECREF(s); /* frees the sequence when owned */
      }
    }
  }
  if (!s || (!result && !owned)) {
    /* no owning handle (a borrowing one does not free): free by id */
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    (void)pkv_py_seq_free_id(h, is_tuple ? PyTuple_GET_ITEM(items, 0) : r);
    PyErr_Restore(et, ev, tb);
    if (!s) Py_DECREF(idobj);
  }
  Py_XDECREF(items);
  Py_DECREF(r);
  return result;
}

/* cls._adopt_polled(owner, name, pool, handle, fn, *args): fn(*args), a raw
 * poll returning [state, id] where a DONE state's id is a new sequence
 * (pkv_transfer_poll), and, when owner.name is None, owner.name = the
 * owning handle of that id, in one C call; returns the poll's result. As in
 * _adopt, an interrupt between the raw poll and the Sequence made in Python
 * dropped the id (the next poll reported it again, but a caller that then
 * dropped the Transfer leaked the sequence and its blocks). Polls on other
 * threads cannot run in between (the GIL is held from the raw call's return
 * on): the first to see DONE makes the one owner; the others find it. */
static PyObject* pkv_py_seq_adopt_polled(PyTypeObject* cls, PyObject* const* args,
                                         Py_ssize_t nargs) {
  if (nargs < 5 || !PyUnicode_Check(args[1]) || Py_TYPE(args[3]) != &pkv_py_handle_type) {
    PyErr_SetString(PyExc_TypeError, "_adopt_polled(owner, name, pool, handle, fn, *args)");
    return NULL;
  }
  PyObject* r = PyObject_Vectorcall(args[4], args + 5, (size_t)(nargs - 5), NULL);
  if (!r) return NULL;
  if (!(PyList_Check(r) || PyTuple_Check(r)) || PySequence_Fast_GET_SIZE(r) < 2) {
    Py_DECREF(r);
    PyErr_SetString(PyExc_TypeError, "_adopt_polled: the call returned no [state, id]");
    return NULL;
  }
  PyObject* stobj = PySequence_Fast_GET_ITEM(r, 0);
  PyObject* idobj = PySequence_Fast_GET_ITEM(r, 1);
  long state = PyLong_Check(stobj) ? PyLong_AsLong(stobj) : -1;
  if (state == -1 && PyErr_Occurred()) PyErr_Clear();
  if (state != PKV_TRANSFER_DONE || !PyLong_Check(idobj)) return r;
  PyObject* cur = PyObject_GetAttr(args[0], args[1]);
  if (!cur) {
    Py_DECREF(r);
    return NULL;
  }
  Py_DECREF(cur);
  if (cur != Py_None) return r; /* an earlier poll made its owner */
  Py_INCREF(idobj);
  pkv_py_seq* s = pkv_py_seq_alloc(cls, args[2], args[3], idobj, 1); /* steals idobj */
  if (!s) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    (void)pkv_py_seq_free_id((pkv_py_handle*)args[3], idobj);
    PyErr_Restore(et, ev, tb);
    Py_DECREF(idobj);
    Py_DECREF(r);
    return NULL;
  }
  int rc = PyObject_SetAttr(args[0], args[1], (PyObject*)s);
  Py_DECREF(s); /* the owner's now; else frees the sequence */
  if (rc < 0) {
    Py_DECREF(r);
    return NULL;
  }
  return r;
}

/* free(): see pagedkv.Sequence.free. */
static PyObject* pkv_py_seq_free_method(pkv_py_seq* s, PyObject* unused) {
  if (s->freed) Py_RETURN_NONE;
  if (!s->h || !s->id || Py_TYPE(s->h) != &pkv_py_handle_type) {
    PyErr_SetString(PyExc_TypeError, "free: the sequence handle is not initialised");
    return NULL;
  }
  pkv_status st = pkv_py_seq_free_id((pkv_py_handle*)s->h, s->id);
  /* INVALID_STATE: the pool is closed (closing released everything);
   * NOT_FOUND: freed by a concurrent free() of this object, or a
   * free_batch of its id. */
  if (st != PKV_OK && st != PKV_E_INVALID_STATE && st != PKV_E_NOT_FOUND) {
    pkv_py_raise(st);
    return NULL;
  }
  s->freed = 1;
  Py_RETURN_NONE;
}

SWIGINTERN PyObject* _wrap_pkv_seq_append(PyObject* self, PyObject* args);

/* append(tokens, lookahead=0): the raw pkv_seq_append of this handle's
 * pool and id, called from C (a Python frame cost about as much as the
 * create + append + free of one token it sits in; issue 16). A lookahead
 * that is not an int, or keyword arguments, take the Python method
 * (Sequence._append_py: its conversions and messages). */
static PyObject* pkv_py_seq_append_method(pkv_py_seq* s, PyObject* const* args, Py_ssize_t nargs,
                                          PyObject* kwnames) {
  /* before the Python method too, whose self._h raised AttributeError */
  if (!s->h || !s->id) {
    PyErr_SetString(PyExc_TypeError, "append: the sequence handle is not initialised");
    return NULL;
  }
  if (kwnames || nargs < 1 || nargs > 2 || (nargs == 2 && !PyLong_CheckExact(args[1]))) {
    PyObject* slow = PyObject_GetAttrString((PyObject*)s, "_append_py");
    if (!slow) return NULL;
    PyObject* r = PyObject_Vectorcall(slow, args, (size_t)nargs, kwnames);
    Py_DECREF(slow);
    return r;
  }
  PyObject* zero = NULL;
  if (nargs == 1) {
    zero = PyLong_FromLong(0);
    if (!zero) return NULL;
  }
  PyObject* t = PyTuple_Pack(4, s->h, s->id, args[0], nargs == 2 ? args[1] : zero);
  Py_XDECREF(zero);
  if (!t) return NULL;
  PyObject* r = _wrap_pkv_seq_append(NULL, t);
  Py_DECREF(t);
  return r;
}

static PyMethodDef pkv_py_seq_methods[] = {
    {"_make", (PyCFunction)(void (*)(void))pkv_py_seq_make, METH_FASTCALL | METH_CLASS,
     "_make(pool, handle, id, owned)"},
    {"_create", (PyCFunction)(void (*)(void))pkv_py_seq_create, METH_FASTCALL | METH_CLASS,
     "_create(pool, handle, owned)"},
    {"_adopt", (PyCFunction)(void (*)(void))pkv_py_seq_adopt, METH_FASTCALL | METH_CLASS,
     "_adopt(pool, handle, owned, fn, *args)"},
    {"_adopt_polled", (PyCFunction)(void (*)(void))pkv_py_seq_adopt_polled,
     METH_FASTCALL | METH_CLASS, "_adopt_polled(owner, name, pool, handle, fn, *args)"},
    {"append", (PyCFunction)(void (*)(void))pkv_py_seq_append_method,
     METH_FASTCALL | METH_KEYWORDS,
     "append($self, /, tokens, lookahead=0)\n--\n\n"
     "Appends tokens (their KV is written by the next step) and reserves\n"
     "lookahead further slots. All or nothing: OutOfBlocksError changes\n"
     "nothing."},
    {"free", (PyCFunction)pkv_py_seq_free_method, METH_NOARGS,
     "Releases the sequence and its blocks. Idempotent; a no-op once the\n"
     "pool is closed (closing released everything)."},
    {NULL, NULL, 0, NULL}};

static PyMemberDef pkv_py_seq_members[] = {
    {"_pool", T_OBJECT_EX, offsetof(pkv_py_seq, pool), 0, "the pool"},
    {"_h", T_OBJECT_EX, offsetof(pkv_py_seq, h), 0, "the pool's handle"},
    {"_id", T_OBJECT_EX, offsetof(pkv_py_seq, id), 0, "the pkv_seq_id"},
    {"_freed", T_BOOL, offsetof(pkv_py_seq, freed), 0, "freed through this handle"},
    {"_owned", T_BOOL, offsetof(pkv_py_seq, owned), 0, "freed when collected"},
    {NULL, 0, 0, 0, NULL}};

/* _adopt_export(cls, engine, export_fn, descriptor_fn, release_fn, engine_h,
 * pool_h, seq_id): export_fn(engine_h, pool_h, seq_id), a raw export
 * returning the new export's id, descriptor_fn(engine_h, id) and the cls
 * object (engine, id, descriptor, _released = False; cls.__init__ is not
 * run) in one C call. In Python an interrupt after the raw export dropped
 * the id (TransferEngine.export released it only if the exception came
 * after the assignment): the export pinned the sequence's blocks until the
 * engine was destroyed (or its TTL, 0 = never). Any failure after the raw
 * export releases it. */
static PyObject* pkv_py_adopt_export(PyObject* unused, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 8 || !PyType_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError,
                    "_adopt_export(cls, engine, export_fn, descriptor_fn, release_fn, engine_h, "
                    "pool_h, seq_id)");
    return NULL;
  }
  PyObject* eh = args[5];
  PyObject* id = PyObject_Vectorcall(args[2], args + 5, 3, NULL);
  if (!id) return NULL;
  PyObject* obj = NULL;
  PyObject* desc = NULL;
  if (!PyLong_Check(id)) {
    /* not an id: nothing this call can release */
    Py_DECREF(id);
    PyErr_SetString(PyExc_TypeError, "_adopt_export: the call returned no export id");
    return NULL;
  }
  PyObject* dargs[2] = {eh, id};
  desc = PyObject_Vectorcall(args[3], dargs, 2, NULL);
  if (desc) {
    PyTypeObject* tp = (PyTypeObject*)args[0];
    PyObject* empty = PyTuple_New(0);
    obj = empty && tp->tp_new ? tp->tp_new(tp, empty, NULL) : NULL;
    Py_XDECREF(empty);
    if (obj && (PyObject_SetAttrString(obj, "engine", args[1]) < 0 ||
                PyObject_SetAttrString(obj, "id", id) < 0 ||
                PyObject_SetAttrString(obj, "descriptor", desc) < 0 ||
                PyObject_SetAttrString(obj, "_released", Py_False) < 0))
      Py_CLEAR(obj);
  }
  if (!obj) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject* r = PyObject_Vectorcall(args[4], dargs, 2, NULL);
    if (r) {
      Py_DECREF(r);
    } else {
      PyErr_Clear();
    }
    PyErr_Restore(et, ev, tb);
  }
  Py_XDECREF(desc);
  Py_DECREF(id);
  return obj;
}

static PyMethodDef pkv_py_adopt_export_def = {
    "_adopt_export", (PyCFunction)(void (*)(void))pkv_py_adopt_export, METH_FASTCALL,
    "_adopt_export(cls, engine, export_fn, descriptor_fn, release_fn, engine_h, pool_h, seq_id)"};

static PyMethodDef pkv_py_handle_methods[] = {
    {"acquire", (PyCFunction)pkv_py_handle_acquire, METH_NOARGS,
     "The pointer, pinned until the matching release()."},
    {"release", (PyCFunction)pkv_py_handle_release, METH_NOARGS, "Drops one pin."},
    {"_pin_into", (PyCFunction)pkv_py_handle_pin_into, METH_O,
     "_pin_into(owner): acquire() and owner._pin = this handle in one C call; the pointer."},
    {"close", (PyCFunction)pkv_py_handle_close, METH_NOARGS,
     "Drops the owner's reference; new pins fail. Idempotent."},
    {"_adopt", (PyCFunction)(void (*)(void))pkv_py_handle_adopt, METH_FASTCALL | METH_CLASS,
     "_adopt(owner, destroy, what, fn, *args): owner._h = the handle of fn(*args)'s new pointer,\n"
     "in one C call (no interrupt between them); returns the handle."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef pkv_py_handle_getset[] = {
    {"closed", (getter)pkv_py_handle_closed, NULL, "Whether close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};
%}

%init %{
  pkv_py_handle_type.tp_name = "pagedkv._pagedkv._Handle";
  pkv_py_handle_type.tp_basicsize = sizeof(pkv_py_handle);
  pkv_py_handle_type.tp_flags = Py_TPFLAGS_DEFAULT;
  pkv_py_handle_type.tp_doc = "A C handle pinned by calls and views (see pagedkv/_handle.py).";
  pkv_py_handle_type.tp_new = pkv_py_handle_new;
  pkv_py_handle_type.tp_dealloc = (destructor)pkv_py_handle_dealloc;
  pkv_py_handle_type.tp_methods = pkv_py_handle_methods;
  pkv_py_handle_type.tp_getset = pkv_py_handle_getset;
  if (PyType_Ready(&pkv_py_handle_type) < 0) return NULL;
  Py_INCREF(&pkv_py_handle_type);
  PyModule_AddObject(m, "_Handle", (PyObject*)&pkv_py_handle_type);
  pkv_py_seq_type.tp_name = "pagedkv._pagedkv._SeqBase";
  pkv_py_seq_type.tp_basicsize = sizeof(pkv_py_seq);
  pkv_py_seq_type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC;
  pkv_py_seq_type.tp_traverse = (traverseproc)pkv_py_seq_traverse;
  pkv_py_seq_type.tp_clear = (inquiry)pkv_py_seq_clear;
  pkv_py_seq_type.tp_doc = "The C part of pagedkv.Sequence.";
  pkv_py_seq_type.tp_new = PyType_GenericNew;
  pkv_py_seq_type.tp_dealloc = (destructor)pkv_py_seq_dealloc;
  pkv_py_seq_type.tp_members = pkv_py_seq_members;
  pkv_py_seq_type.tp_methods = pkv_py_seq_methods;
  pkv_py_seq_type.tp_weaklistoffset = offsetof(pkv_py_seq, weakrefs);
  if (PyType_Ready(&pkv_py_seq_type) < 0) return NULL;
  Py_INCREF(&pkv_py_seq_type);
  PyModule_AddObject(m, "_SeqBase", (PyObject*)&pkv_py_seq_type);
  {
    PyObject* f = PyCFunction_NewEx(&pkv_py_adopt_export_def, NULL, NULL);
    if (!f || PyModule_AddObject(m, "_adopt_export", f) < 0) return NULL;
  }
%}

%define PKV_HANDLE_IN(TYPE)
%typemap(in) TYPE* pool (void* argp = 0, pkv_py_handle* pin = NULL), const TYPE* pool (void* argp = 0, pkv_py_handle* pin = NULL),
             TYPE* batch (void* argp = 0, pkv_py_handle* pin = NULL), const TYPE* batch (void* argp = 0, pkv_py_handle* pin = NULL) {
  if (!pkv_py_handle_arg($input, $descriptor(TYPE*), "$symname", PKV_PY_IS_DESTROY("$symname"), $argnum, &argp, &pin)) SWIG_fail;
  $1 = ($1_ltype)argp;
}
%typemap(freearg) TYPE* pool, const TYPE* pool, TYPE* batch, const TYPE* batch {
  if (pin$argnum) pkv_py_handle_unpin(pin$argnum);
}
%enddef
PKV_HANDLE_IN(pkv_pool)
PKV_HANDLE_IN(pkv_batch)

/* A publisher is owned by one Python object (pagedkv.events.EventPublisher)
 * through a _Handle, pinned for each call as pools are. */
%typemap(in) pkv_event_publisher* pub (void* argp = 0, pkv_py_handle* pin = NULL),
             const pkv_event_publisher* pub (void* argp = 0, pkv_py_handle* pin = NULL) {
  if (!pkv_py_handle_arg($input, $descriptor(pkv_event_publisher*), "$symname", PKV_PY_IS_DESTROY("$symname"), $argnum, &argp, &pin)) SWIG_fail;
  $1 = ($1_ltype)argp;
}
%typemap(freearg) pkv_event_publisher* pub, const pkv_event_publisher* pub {
  if (pin$argnum) pkv_py_handle_unpin(pin$argnum);
}
/* Transfer engines and transfers (pagedkv/transfer.py) are _Handles too. */
%define PKV_HANDLE_IN_NAMED(TYPE, NAME)
%typemap(in) TYPE* NAME (void* argp = 0, pkv_py_handle* pin = NULL), const TYPE* NAME (void* argp = 0, pkv_py_handle* pin = NULL) {
  if (!pkv_py_handle_arg($input, $descriptor(TYPE*), "$symname", PKV_PY_IS_DESTROY("$symname"), $argnum, &argp, &pin)) SWIG_fail;
  $1 = ($1_ltype)argp;
}
%typemap(freearg) TYPE* NAME, const TYPE* NAME {
  if (pin$argnum) pkv_py_handle_unpin(pin$argnum);
}
%enddef
PKV_HANDLE_IN_NAMED(pkv_transfer_engine, engine)
PKV_HANDLE_IN_NAMED(pkv_transfer, transfer)

/* Integer scalars: the helpers of the typemaps in "integer scalars" below,
 * also used by the multi-argument typemaps for their counts and sizes. */
%{
#include <limits.h>

/* The fast paths, as SWIG_AsVal_*: 0 leaves no error set. */
static inline int pkv_py_arg_u(PyObject* obj, unsigned long long hi, unsigned long long* out) {
  if (!PyLong_Check(obj)) return 0;
#if ULONG_MAX == ULLONG_MAX
  /* SWIG's call: PyLong_AsUnsignedLongLong goes through _PyLong_AsByteArray
   * for an int of more than one digit (every seq id), measurably slower. */
  const unsigned long long v = PyLong_AsUnsignedLong(obj);
#else
  const unsigned long long v = PyLong_AsUnsignedLongLong(obj);
#endif
  if (v == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    return 0;
  }
  if (v > hi) return 0;
  *out = v;
  return 1;
}

static inline int pkv_py_arg_s(PyObject* obj, long long lo, long long hi, long long* out) {
  if (!PyLong_Check(obj)) return 0;
  int ovf = 0;
  const long long v = PyLong_AsLongLongAndOverflow(obj, &ovf);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return 0;
  }
  if (ovf || v < lo || v > hi) return 0;
  *out = v;
  return 1;
}

/* The error of a value the fast path refused. fn is the wrapper's name: a
 * struct member setter ("pkv_pool_options_block_size_set" for the field
 * "block_size") is named "pkv_pool_options.block_size". */
#if defined(__GNUC__)
__attribute__((cold, noinline))
#endif
static void pkv_py_int_arg_error(PyObject* obj, const char* fn, const char* name, const char* type,
                                 const char* range) {
  char where[256];
  const size_t fl = strlen(fn), nl = strcspn(name, "["); /* "shape[2]": the field shape */
  if (fl > nl + 5 && strcmp(fn + fl - 4, "_set") == 0 && fn[fl - nl - 5] == '_' &&
      strncmp(fn + fl - nl - 4, name, nl) == 0) {
    PyOS_snprintf(where, sizeof where, "%.*s.%s", (int)(fl - nl - 5), fn, name);
  } else {
    PyOS_snprintf(where, sizeof where, "%s: %s", fn, name);
  }
  /* The value as given; an int too long to print (or to print usefully:
   * str() of more than 4300 digits raises) by its size. */
  PyObject* shown = NULL;
  if (PyLong_Check(obj)) {
    PyObject* bits = PyObject_CallMethod(obj, "bit_length", NULL);
    const long long nbits = bits ? PyLong_AsLongLong(bits) : -1;
    Py_XDECREF(bits);
    PyErr_Clear();
    shown = nbits >= 0 && nbits <= 128
                ? PyObject_Repr(obj)
                : PyUnicode_FromFormat("an int of %lld bits", nbits);
  } else {
    PyObject* r = PyObject_Repr(obj);
    if (r && PyUnicode_GET_LENGTH(r) <= 60) {
      shown = PyUnicode_FromFormat("%U (%s)", r, Py_TYPE(obj)->tp_name);
    } else {
      shown = PyUnicode_FromString(Py_TYPE(obj)->tp_name);
    }
    Py_XDECREF(r);
  }
  if (!shown) {
    PyErr_Clear();
    shown = PyUnicode_FromString(Py_TYPE(obj)->tp_name);
    if (!shown) return;
  }
  PyErr_Format(PyLong_Check(obj) ? PyExc_OverflowError : PyExc_TypeError,
               "%s must be an int in %s (%s), got %U%s", where, range, type, shown,
               !PyLong_Check(obj) && PyIndex_Check(obj) ? "; pass int(value)" : "");
  Py_DECREF(shown);
}

/* A uint64_t that a multi-argument typemap takes (a capacity, a size):
 * as the integer typemaps, named (it was Python's bare "can't convert
 * negative int to unsigned" or "an integer is required"). */
static int pkv_py_u64_arg(PyObject* obj, const char* fn, const char* name, unsigned long long* out) {
  if (pkv_py_arg_u(obj, ULLONG_MAX, out)) return 1;
  pkv_py_int_arg_error(obj, fn, name, "uint64_t", "[0, 2^64 - 1]");
  return 0;
}

/* An int64_t element of a shape or strides: any integer (numpy's too, as
 * PyLong_AsLongLong took them), a bad one named "<fn>: <name>[i]". */
static int pkv_py_i64_item(PyObject* obj, const char* fn, const char* name, Py_ssize_t i, int64_t* out) {
  long long v = 0;
  if (pkv_py_arg_s(obj, LLONG_MIN, LLONG_MAX, &v)) {
    *out = (int64_t)v;
    return 1;
  }
  char at[96];
  PyOS_snprintf(at, sizeof at, "%.60s[%zd]", name, i);
  if (!PyLong_Check(obj) && PyIndex_Check(obj)) {
    PyObject* idx = PyNumber_Index(obj);
    if (!idx) {
      if (PyErr_ExceptionMatches(PyExc_TypeError)) { /* a float torch tensor's __index__ */
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: %s: expected an int, got %s", fn, at,
                     Py_TYPE(obj)->tp_name);
      }
      return 0;
    }
    const int ok = pkv_py_arg_s(idx, LLONG_MIN, LLONG_MAX, &v);
    if (!ok) pkv_py_int_arg_error(idx, fn, at, "int64_t", "[-2^63, 2^63 - 1]");
    Py_DECREF(idx);
    if (ok) *out = (int64_t)v;
    return ok;
  }
  pkv_py_int_arg_error(obj, fn, at, "int64_t", "[-2^63, 2^63 - 1]");
  return 0;
}
%}

/* ------------------------------------------------------------ conversions */

%{
/* None or an int address -> pointer. */
static int pkv_py_as_ptr(PyObject* obj, const char* name, void** out) {
  if (obj == Py_None) {
    *out = NULL;
    return 1;
  }
  if (PyLong_Check(obj)) {
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (PyErr_Occurred()) {
      PyErr_Format(PyExc_OverflowError, "%s: address out of range", name);
      return 0;
    }
    *out = (void*)(uintptr_t)v;
    return 1;
  }
  PyErr_Format(PyExc_TypeError, "%s: expected None or an int address, got %s", name,
               Py_TYPE(obj)->tp_name);
  return 0;
}

static int pkv_py_long_range(PyObject* item, const char* name, Py_ssize_t i, long long lo,
                             long long hi, long long* out) {
  if (PyLong_CheckExact(item)) { /* the common case, without PyNumber_Index's new reference */
    int ovf = 0;
    long long v = PyLong_AsLongLongAndOverflow(item, &ovf);
    if (!ovf && v >= lo && v <= hi) {
      *out = v;
      return 1;
    }
  }
  if (!PyLong_Check(item) && !PyIndex_Check(item)) {
    PyErr_Format(PyExc_TypeError, "%s[%zd]: expected an int, got %s", name, i,
                 Py_TYPE(item)->tp_name);
    return 0;
  }
  int overflow = 0;
  PyObject* idx = PyNumber_Index(item);
  if (!idx) {
    /* An element whose __index__ refuses (a float or bfloat16 torch tensor,
     * one that requires grad: "only integer tensors of a single element can
     * be converted to an index") is named as any non-int element. */
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "%s[%zd]: expected an int, got %s", name, i,
                   Py_TYPE(item)->tp_name);
    } else if (PyErr_ExceptionMatches(PyExc_RuntimeError) ||
               PyErr_ExceptionMatches(PyExc_NotImplementedError) ||
               PyErr_ExceptionMatches(PyExc_ValueError)) {
      /* An element that has no value to read (a meta torch tensor's:
       * "Tensor.item() cannot be called on meta tensors") raised the
       * element's RuntimeError, naming neither the argument nor the index:
       * named as any element that is not an int, with its reason. */
      PyObject *et, *ev, *tb;
      PyErr_Fetch(&et, &ev, &tb);
      PyErr_NormalizeException(&et, &ev, &tb);
      PyErr_Format(PyExc_TypeError, "%s[%zd]: expected an int, got %s (%S)", name, i,
                   Py_TYPE(item)->tp_name, ev ? ev : Py_None);
      Py_XDECREF(et);
      Py_XDECREF(ev);
      Py_XDECREF(tb);
    }
    return 0;
  }
  long long v = PyLong_AsLongLongAndOverflow(idx, &overflow);
  Py_DECREF(idx);
  if (v == -1 && PyErr_Occurred()) return 0;
  if (overflow || v < lo || v > hi) {
    PyErr_Format(PyExc_OverflowError, "%s[%zd]: value out of range [%lld, %lld]", name, i, lo, hi);
    return 0;
  }
  *out = v;
  return 1;
}

/* An empty view: freearg code runs for arguments whose in-typemap did not
 * (an earlier argument failed), so each view starts released. */
static Py_buffer pkv_py_no_buffer(void) {
  Py_buffer b;
  memset(&b, 0, sizeof b);
  return b;
}

/* A private malloc'd copy of a buffer's bytes (at least one byte), so that
 * no thread can change what a call reads while it runs without the GIL.
 * On failure the view is released and MemoryError set. */
static void* pkv_py_copy_buffer(Py_buffer* view) {
  void* copy = malloc(view->len > 0 ? (size_t)view->len : 1);
  if (!copy) {
    PyBuffer_Release(view);
    view->obj = NULL;
    PyErr_NoMemory();
    return NULL;
  }
  if (view->len > 0) memcpy(copy, view->buf, (size_t)view->len);
  return copy;
}

/* Whether a buffer format is a plain integer of itemsize bytes. */
static int pkv_py_int_format(const char* f, Py_ssize_t itemsize) {
  if (f[0] == 0 || f[1] != 0) return 0;
  switch (f[0]) {
    case 'b': case 'B': case 'h': case 'H': case 'i': case 'I':
    case 'l': case 'L': case 'q': case 'Q': case 'n': case 'N':
      return itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8;
    default:
      return 0;
  }
}

/* Element i of an integer buffer; 0 when an unsigned value exceeds int64. */
static int pkv_py_int_item(const void* buf, const char* f, Py_ssize_t itemsize, Py_ssize_t i,
                           long long* out) {
  const int is_unsigned = f[0] == 'B' || f[0] == 'H' || f[0] == 'I' || f[0] == 'L' || f[0] == 'Q' || f[0] == 'N';
  const unsigned char* p = (const unsigned char*)buf + i * itemsize;
  if (itemsize == 1) { *out = is_unsigned ? (long long)*(const uint8_t*)p : (long long)*(const int8_t*)p; return 1; }
  if (itemsize == 2) { uint16_t x; memcpy(&x, p, 2); *out = is_unsigned ? (long long)x : (long long)(int16_t)x; return 1; }
  if (itemsize == 4) { uint32_t x; memcpy(&x, p, 4); *out = is_unsigned ? (long long)x : (long long)(int32_t)x; return 1; }
  uint64_t x;
  memcpy(&x, p, 8);
  if (is_unsigned && x > (uint64_t)INT64_MAX) return 0;
  *out = (long long)x;
  return 1;
}

/* A buffer-protocol array for obj when it is a CPU torch tensor (its numpy()
 * view, no copy) or has __array_interface__ (numpy.asarray, no copy); NULL
 * without an error when it is neither. */
static PyObject* pkv_py_as_array(PyObject* obj) {
  PyTypeObject* t = Py_TYPE(obj);
  const char* tn = t->tp_name;
  if (strcmp(tn, "Tensor") == 0 || strcmp(tn, "torch.Tensor") == 0 || strstr(tn, "Parameter")) {
    PyObject* r = PyObject_CallMethod(obj, "numpy", NULL);
    if (!r) PyErr_Clear(); /* a CUDA or grad tensor: fall through to the sequence path */
    return r;
  }
  if (PyObject_HasAttrString(obj, "__array_interface__")) {
    PyObject* np = PyImport_ImportModule("numpy");
    if (!np) {
      PyErr_Clear();
      return NULL;
    }
    /* asarray, not ascontiguousarray: a view, whose length is checked
     * before anything is copied (the strided path reads it); a contiguous
     * copy of a broadcast of 2^31 elements took 8 GB first. */
    PyObject* r = PyObject_CallMethod(np, "asarray", "O", obj);
    Py_DECREF(np);
    if (!r) PyErr_Clear();
    return r;
  }
  return NULL;
}

/* An int32 array from obj: copied from an integer buffer (one memcpy from
 * a contiguous int32 one) or any sequence of ints. *owned tells whether
 * *data must be freed; view->obj whether the buffer must be released.
 *
 * Arrays are never borrowed: the calls run without the GIL, so another
 * thread may write the caller's buffer meanwhile, and the library checks
 * block ids, then indexes with them (a borrowed block id array changed in
 * between made copy_blocks and swap_in/out copy out of bounds). The copy
 * is the library's alone; it costs a memcpy next to a call that checks
 * every element anyway. */
/* Sets and dicts iterate in no order the caller chose (a dict gives its
 * keys): as token ids or block ids they are a mistake, refused by name. */
static int pkv_py_unordered(PyObject* obj, const char* name) {
  if (PyAnySet_Check(obj) || PyDict_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "%s: expected an ordered sequence or buffer of ints, got %s", name,
                 Py_TYPE(obj)->tp_name);
    return 1;
  }
  return 0;
}

/* PySequence_Fast for the conversion loops, whose items are read by index
 * while each is converted: a conversion can run the caller's Python code
 * (__index__, __float__, __len__ of an item), which may shrink or clear a
 * list given as it is, and the loop then read items past its end (freed
 * memory: a segmentation fault). A list is copied into a tuple, which no
 * such code can change; PySequence_Fast builds a list of its own from
 * anything else, and a tuple is immutable already. */
static PyObject* pkv_py_items(PyObject* obj, const char* msg) {
  if (PyList_CheckExact(obj)) return PyList_AsTuple(obj);
  return PySequence_Fast(obj, msg);
}

/* Counts the conversions refuse before they read or allocate anything for
 * an argument. A sequence holds at most 2^31 - 1 tokens (pool.h); no pool
 * has more blocks (2^31 - 3), so block ids, copy pairs and block hashes
 * get the same bound, as does hash_prefix (it hashes what a sequence could
 * hold). A pool holds at most 2^24 sequences at once (docs/conventions.md)
 * and a batch names each once: seq id arrays, and the per-sequence tokens
 * and query counts beside them, get that bound. Without these checks
 * seq.append(range(2**31)) built a list of 2^31 ints (tens of GB) and a
 * broadcast numpy array of 2^31 tokens was copied into an 8 GB buffer
 * before the library refused the count. */
#define PKV_PY_MAX_TOKENS 0x7fffffffLL
#define PKV_PY_MAX_SEQS (1LL << 24)

/* Raises the class the library registers for status st with message msg
 * (a new reference, consumed); ValueError when none is registered. */
static void pkv_py_raise_status(pkv_status st, PyObject* msg) {
  if (!msg) return;
  const int idx = st < 0 ? -st : st;
  PyObject* cls = idx <= PKV_PY_MAX_CODE ? pkv_py_error_classes[idx] : NULL;
  PyObject* exc = cls ? PyObject_CallFunction(cls, "Oi", msg, (int)st) : NULL;
  if (exc) {
    PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  } else if (!PyErr_Occurred()) {
    PyErr_SetObject(PyExc_ValueError, msg);
  }
  Py_DECREF(msg);
}

/* InvalidArgumentError (what the library raises for too many tokens) for
 * n items of name above max; n < 0: a len() beyond any index. Returns 0. */
static int pkv_py_too_many(const char* name, long long n, long long max) {
  const char* why = max == PKV_PY_MAX_SEQS ? "2^24, the sequences a pool holds at once"
                    : max == PKV_PY_MAX_TOKENS ? "2^31 - 1" : NULL;
  PyObject* msg;
  if (n < 0)
    msg = why ? PyUnicode_FromFormat("%s: a length beyond any index, more than %s", name, why)
              : PyUnicode_FromFormat("%s: a length beyond any index, more than %lld", name, max);
  else
    msg = why ? PyUnicode_FromFormat("%s: %lld items, more than %s", name, n, why)
              : PyUnicode_FromFormat("%s: %lld items, more than %lld", name, n, max);
  pkv_py_raise_status(PKV_E_INVALID_ARGUMENT, msg);
  return 0;
}

/* 1 when obj's length, as it says without being read (len(); an
 * iterator's __length_hint__, by which list() would size its copy), is at
 * most max; else 0 with an error set (pkv_py_too_many, or what __len__
 * raised). Unsized objects pass (their items are counted as read). */
static int pkv_py_len_ok(PyObject* obj, const char* name, long long max) {
  Py_ssize_t n;
  if (PyList_Check(obj) || PyTuple_Check(obj)) { /* a subclass's __len__ is not what is read */
    n = Py_SIZE(obj);
  } else {
    n = PyObject_LengthHint(obj, 0);
    if (n < 0) {
      if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return 0;
      PyErr_Clear(); /* __len__ gave 2**64 or more */
      return pkv_py_too_many(name, -1, max);
    }
  }
  if ((long long)n > max) return pkv_py_too_many(name, (long long)n, max);
  return 1;
}

/* pkv_py_items after pkv_py_len_ok. */
static PyObject* pkv_py_items_max(PyObject* obj, const char* name, long long max, const char* msg) {
  if (!pkv_py_len_ok(obj, name, max)) return NULL;
  PyObject* seq = pkv_py_items(obj, msg);
  /* What __len__ said may be less than what iterating gave */
  if (seq && (long long)PySequence_Fast_GET_SIZE(seq) > max) {
    pkv_py_too_many(name, (long long)PySequence_Fast_GET_SIZE(seq), max);
    Py_DECREF(seq);
    return NULL;
  }
  return seq;
}

static int pkv_py_int32_array_from(PyObject* obj, const char* name, long long max, int32_t** data,
                                   uint64_t* n, Py_buffer* view, int* owned, int convert) {
  *owned = 0;
  view->obj = NULL;
  if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) goto sequence; /* the common case */
  if (PyObject_CheckBuffer(obj) &&
      PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
    const char* f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') ++f;
    if (view->ndim > 1) {  /* read as rows, it failed with numpy's "only integer scalar arrays" */
      PyErr_Format(PyExc_TypeError, "%s: expected a 1-d array of ints, got %d dimensions", name,
                   view->ndim);
      PyBuffer_Release(view);
      view->obj = NULL;
      return 0;
    }
    if (view->itemsize > 0 && (long long)(view->len / view->itemsize) > max) {
      PyBuffer_Release(view);
      view->obj = NULL;
      return pkv_py_too_many(name, (long long)(view->len / view->itemsize), max);
    }
    if (view->itemsize == 4 && view->ndim <= 1 && (strcmp(f, "i") == 0 ||
                                                   (strcmp(f, "l") == 0 && sizeof(long) == 4))) {
      int32_t* buf = (int32_t*)pkv_py_copy_buffer(view);
      if (!buf) return 0;
      *data = buf;
      *n = (uint64_t)(view->len / 4);
      PyBuffer_Release(view);
      view->obj = NULL;
      *owned = 1;
      return 1;
    }
    if (view->ndim <= 1 && pkv_py_int_format(f, view->itemsize)) {
      /* other integer widths (int64 token tensors): converted, range checked */
      Py_ssize_t len = view->len / view->itemsize;
      int32_t* buf = (int32_t*)malloc(sizeof(int32_t) * (size_t)(len > 0 ? len : 1));
      if (!buf) {
        PyBuffer_Release(view);
        view->obj = NULL;
        PyErr_NoMemory();
        return 0;
      }
      for (Py_ssize_t i = 0; i < len; ++i) {
        long long v;
        if (!pkv_py_int_item(view->buf, f, view->itemsize, i, &v) || v < INT32_MIN || v > INT32_MAX) {
          free(buf);
          PyBuffer_Release(view);
          view->obj = NULL;
          PyErr_Format(PyExc_OverflowError, "%s[%zd]: value out of range [%d, %d]", name, i, INT32_MIN,
                       INT32_MAX);
          return 0;
        }
        buf[i] = (int32_t)v;
      }
      PyBuffer_Release(view);
      view->obj = NULL;
      *data = buf;
      *n = (uint64_t)len;
      *owned = 1;
      return 1;
    }
    PyBuffer_Release(view);
    view->obj = NULL;
  }
  PyErr_Clear();
  /* A strided 1-d integer buffer (a numpy slice, a reversed or broadcast
   * array): copied element by element into 4 bytes each. Read as a
   * sequence it took a Python int object per element (a broadcast of 2^26
   * tokens: 2.9 GB and 16 s; of 2^31, more memory than the machine). */
  if (PyObject_CheckBuffer(obj) &&
      PyObject_GetBuffer(obj, view, PyBUF_STRIDES | PyBUF_FORMAT) == 0) {
    const char* f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') ++f;
    if (view->ndim > 1) {  /* as a contiguous one */
      PyErr_Format(PyExc_TypeError, "%s: expected a 1-d array of ints, got %d dimensions", name,
                   view->ndim);
      PyBuffer_Release(view);
      view->obj = NULL;
      return 0;
    }
    if (view->ndim == 1 && pkv_py_int_format(f, view->itemsize)) {
      const Py_ssize_t len = view->shape[0], step = view->strides[0];
      if ((long long)len > max) { /* a broadcast: its length costs it no memory */
        PyBuffer_Release(view);
        view->obj = NULL;
        return pkv_py_too_many(name, (long long)len, max);
      }
      /* calloc checks the product: a broadcast of 2^62 int8 describes 2^62
       * elements in no memory, and 4 * 2^62 bytes wrapped to malloc(0). */
      int32_t* buf = (int32_t*)calloc((size_t)(len > 0 ? len : 1), sizeof(int32_t));
      if (!buf) {
        PyBuffer_Release(view);
        view->obj = NULL;
        PyErr_NoMemory();
        return 0;
      }
      for (Py_ssize_t i = 0; i < len; ++i) {
        long long v;
        const char* at = (const char*)view->buf + i * step;
        if (!pkv_py_int_item(at, f, view->itemsize, 0, &v) || v < INT32_MIN || v > INT32_MAX) {
          free(buf);
          PyBuffer_Release(view);
          view->obj = NULL;
          PyErr_Format(PyExc_OverflowError, "%s[%zd]: value out of range [%d, %d]", name, i, INT32_MIN,
                       INT32_MAX);
          return 0;
        }
        buf[i] = (int32_t)v;
      }
      PyBuffer_Release(view);
      view->obj = NULL;
      *data = buf;
      *n = (uint64_t)len;
      *owned = 1;
      return 1;
    }
    PyBuffer_Release(view);
    view->obj = NULL;
  }
  PyErr_Clear();
  if (convert && !PyObject_CheckBuffer(obj)) {
    /* Arrays without the buffer protocol: a CPU torch tensor through its
     * numpy() view, anything with __array_interface__ through numpy (the
     * view keeps the array alive). Converted once: a tensor-like object
     * whose numpy() gives another such object (or itself) is then read as
     * a sequence, not converted again without end. */
    PyObject* arr = pkv_py_as_array(obj);
    if (arr) {
      int ok = pkv_py_int32_array_from(arr, name, max, data, n, view, owned, 0);
      Py_DECREF(arr);
      return ok;
    }
  }
sequence:;
  if (pkv_py_unordered(obj, name)) return 0;
  PyObject* seq = pkv_py_items_max(obj, name, max, "expected a sequence of ints");
  if (!seq) {
    /* Only "not a sequence" is renamed: a MemoryError (range(2**62): no
     * room for its items) is not the caller passing the wrong kind. */
    if (PyErr_ExceptionMatches(PyExc_TypeError))
      PyErr_Format(PyExc_TypeError, "%s: expected a sequence or buffer of ints, got %s", name,
                   Py_TYPE(obj)->tp_name);
    return 0;
  }
  Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
  int32_t* buf = (int32_t*)malloc(sizeof(int32_t) * (size_t)(len > 0 ? len : 1));
  if (!buf) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return 0;
  }
  for (Py_ssize_t i = 0; i < len; ++i) {
    long long v;
    if (!pkv_py_long_range(PySequence_Fast_GET_ITEM(seq, i), name, i, INT32_MIN, INT32_MAX, &v)) {
      free(buf);
      Py_DECREF(seq);
      return 0;
    }
    buf[i] = (int32_t)v;
  }
  Py_DECREF(seq);
  *data = buf;
  *n = (uint64_t)len;
  *owned = 1;
  return 1;
}

static int pkv_py_int32_array(PyObject* obj, const char* name, long long max, int32_t** data,
                              uint64_t* n, Py_buffer* view, int* owned) {
  return pkv_py_int32_array_from(obj, name, max, data, n, view, owned, 1);
}

static void pkv_py_int32_release(int32_t* data, Py_buffer* view, int owned) {
  if (owned) free(data);
  if (view->obj) PyBuffer_Release(view);
}

/* A copied array of unsigned ints of `bytes` width each from any sequence. */
static void* pkv_py_uint_array(PyObject* obj, const char* name, size_t width,
                               unsigned long long hi, long long max, Py_ssize_t* len_out) {
  if (pkv_py_unordered(obj, name)) return NULL;
  PyObject* seq = pkv_py_items_max(obj, name, max, "expected a sequence of ints");
  if (!seq) {
    if (PyErr_ExceptionMatches(PyExc_TypeError))  /* as in pkv_py_int32_array_from */
      PyErr_Format(PyExc_TypeError, "%s: expected a sequence of ints, got %s", name,
                   Py_TYPE(obj)->tp_name);
    return NULL;
  }
  Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
  unsigned char* buf = (unsigned char*)malloc(width * (size_t)(len > 0 ? len : 1));
  if (!buf) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return NULL;
  }
  for (Py_ssize_t i = 0; i < len; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
    PyObject* idx = PyNumber_Index(item);
    if (!idx) {
      /* Not an int (a float, a Sequence object, None): a TypeError, as the
       * int32 arrays (tokens) raise, not an OverflowError. */
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "%s[%zd]: expected an int, got %s", name, i,
                   Py_TYPE(item)->tp_name);
      free(buf);
      Py_DECREF(seq);
      return NULL;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(idx);
    Py_DECREF(idx);
    if ((v == (unsigned long long)-1 && PyErr_Occurred()) || v > hi) {
      PyErr_Clear();
      PyErr_Format(PyExc_OverflowError, "%s[%zd]: expected an int in [0, %llu]", name, i, hi);
      free(buf);
      Py_DECREF(seq);
      return NULL;
    }
    if (width == 8) {
      uint64_t x = (uint64_t)v;
      memcpy(buf + 8 * i, &x, 8);
    } else {
      uint32_t x = (uint32_t)v;
      memcpy(buf + 4 * i, &x, 4);
    }
  }
  Py_DECREF(seq);
  *len_out = len;
  return buf;
}

/* (data, byte_offset, dtype, device_type, device_id, shape, strides) */
static int pkv_py_tensor_from_tuple(PyObject* t, const char* name, pkv_tensor* out) {
  memset(out, 0, sizeof *out);
  if (PyTuple_GET_SIZE(t) != 7) {
    PyErr_Format(PyExc_TypeError,
                 "%s: tensor tuple must be (data, byte_offset, dtype, device_type, device_id, "
                 "shape, strides)", name);
    return 0;
  }
  if (!pkv_py_as_ptr(PyTuple_GET_ITEM(t, 0), name, &out->data)) return 0;
  unsigned long long off = 0;
  if (!pkv_py_u64_arg(PyTuple_GET_ITEM(t, 1), name, "byte_offset", &off)) return 0;
  /* Range checked: a cast to 32 bits made dtype 2^32 + 1 f32 and device
   * id 2^32 device 0. */
  static const char* const fields[3] = {"dtype", "device_type", "device_id"};
  static const long long lo[3] = {0, INT32_MIN, INT32_MIN};
  static const long long hi[3] = {UINT32_MAX, INT32_MAX, INT32_MAX};
  long long v[3];
  for (int i = 0; i < 3; ++i) {
    int ovf = 0;
    v[i] = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(t, 2 + i), &ovf);
    if (v[i] == -1 && PyErr_Occurred()) return 0;
    if (ovf || v[i] < lo[i] || v[i] > hi[i]) {
      PyErr_Format(PyExc_OverflowError, "%s: %s is out of range [%lld, %lld]", name, fields[i], lo[i],
                   hi[i]);
      return 0;
    }
  }
  out->byte_offset = off;
  out->dtype = (uint32_t)v[0];
  out->device_type = (int32_t)v[1];
  out->device_id = (int32_t)v[2];
  PyObject* shape = pkv_py_items(PyTuple_GET_ITEM(t, 5), "shape must be a sequence");
  if (!shape) return 0;
  Py_ssize_t nd = PySequence_Fast_GET_SIZE(shape);
  if (nd < 1 || nd > PKV_TENSOR_MAX_DIMS) {
    Py_DECREF(shape);
    PyErr_Format(PyExc_ValueError, "%s: ndim %zd outside [1, %d]", name, nd, PKV_TENSOR_MAX_DIMS);
    return 0;
  }
  out->ndim = (int32_t)nd;
  for (Py_ssize_t i = 0; i < nd; ++i) {
    if (!pkv_py_i64_item(PySequence_Fast_GET_ITEM(shape, i), name, "shape", i, &out->shape[i])) {
      Py_DECREF(shape);
      return 0;
    }
  }
  Py_DECREF(shape);
  PyObject* st = PyTuple_GET_ITEM(t, 6);
  if (st != Py_None) {
    PyObject* strides = pkv_py_items(st, "strides must be a sequence or None");
    if (!strides) return 0;
    if (PySequence_Fast_GET_SIZE(strides) != nd) {
      Py_DECREF(strides);
      PyErr_Format(PyExc_ValueError, "%s: strides and shape differ in length", name);
      return 0;
    }
    for (Py_ssize_t i = 0; i < nd; ++i) {
      if (!pkv_py_i64_item(PySequence_Fast_GET_ITEM(strides, i), name, "strides", i, &out->strides[i])) {
        Py_DECREF(strides);
        return 0;
      }
    }
    Py_DECREF(strides);
  }
  return 1;
}

/* Sets fields of the struct at ptr from a dict through its SWIG proxy, so
 * each field gets the generated setter's type and range checks. Keys in
 * `special` are left to the caller. */
static int pkv_py_apply_dict(PyObject* dict, void* ptr, swig_type_info* ty, const char* name,
                             const char* const* special) {
  if (!PyDict_Check(dict)) {
    PyErr_Format(PyExc_TypeError, "%s: expected None, a %s or a dict, got %s", name, SWIG_TypePrettyName(ty),
                 Py_TYPE(dict)->tp_name);
    return 0;
  }
  PyObject* proxy = SWIG_NewPointerObj(ptr, ty, 0);
  if (!proxy) return 0;
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  int ok = 1;
  while (ok && PyDict_Next(dict, &pos, &key, &value)) {
    const char* k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
    if (!k) {
      PyErr_Format(PyExc_TypeError, "%s: option names must be str", name);
      ok = 0;
      break;
    }
    int skip = 0;
    for (const char* const* s = special; s && *s; ++s) skip |= strcmp(*s, k) == 0;
    if (skip) continue;
    /* Only the struct's fields: proxies would accept any attribute. */
    PyObject* field = PyObject_GetAttr((PyObject*)Py_TYPE(proxy), key);
    int is_field = field && PyObject_TypeCheck(field, &PyProperty_Type);
    Py_XDECREF(field);
    if (!is_field) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "%s: unknown option '%s' for %s", name, k, SWIG_TypePrettyName(ty));
      ok = 0;
    } else if (PyObject_SetAttr(proxy, key, value) != 0) {
      ok = 0;
    }
  }
  Py_DECREF(proxy);
  return ok;
}

/* A string option from the dict, borrowed from a str the scratch list keeps
 * alive for the call; NULL when absent or None. */
/* PyUnicode_AsUTF8AndSize with the argument named: a str UTF-8 cannot
 * encode (a lone surrogate, "\ud800") raised UnicodeEncodeError "'utf-8'
 * codec can't encode character", naming no argument. It is a ValueError
 * "<prefix><name>: ..." now (prefix "option " for option dicts, as their
 * other messages; index >= 0 names an item, "<name>[i]"). */
static const char* pkv_py_utf8(PyObject* v, const char* prefix, const char* name, Py_ssize_t index,
                               Py_ssize_t* len) {
  const char* s = PyUnicode_AsUTF8AndSize(v, len);
  if (!s && PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
    PyObject *t, *val, *tb;
    PyErr_Fetch(&t, &val, &tb);
    PyErr_NormalizeException(&t, &val, &tb);
    Py_ssize_t at = 0;
    if (!val || PyUnicodeEncodeError_GetStart(val, &at) != 0) {
      PyErr_Clear();
      at = 0;
    }
    Py_XDECREF(t);
    Py_XDECREF(val);
    Py_XDECREF(tb);
    const Py_UCS4 c = at < PyUnicode_GET_LENGTH(v) ? PyUnicode_ReadChar(v, at) : 0;
    if (index >= 0)
      PyErr_Format(PyExc_ValueError, "%s%s[%zd]: not encodable as UTF-8 (a lone surrogate, U+%x, at index %zd)",
                   prefix, name, index, (unsigned)c, at);
    else
      PyErr_Format(PyExc_ValueError, "%s%s: not encodable as UTF-8 (a lone surrogate, U+%x, at index %zd)", prefix,
                   name, (unsigned)c, at);
  }
  return s;
}

static int pkv_py_dict_str(PyObject* dict, const char* key, PyObject* keep, const char** out) {
  PyObject* v = PyDict_GetItemString(dict, key);
  *out = NULL;
  if (!v || v == Py_None) return 1;
  if (!PyUnicode_Check(v)) {
    PyErr_Format(PyExc_TypeError, "option %s: expected str or None, got %s", key,
                 Py_TYPE(v)->tp_name);
    return 0;
  }
  Py_ssize_t len = 0;
  const char* s = pkv_py_utf8(v, "option ", key, -1, &len);
  if (!s) return 0;
  if (strlen(s) != (size_t)len) {
    /* C reads up to the first NUL: "salt\0a" and "salt\0b" would be one
     * cache salt (one tenant), two hash seeds one seed, a path another path. */
    PyErr_Format(PyExc_ValueError, "option %s: embedded null character", key);
    return 0;
  }
  if (PyList_Append(keep, v) != 0) return 0;
  *out = s;
  return 1;
}

/* A C string argument (const char* seed, endpoint, replay_endpoint): a str
 * without NUL characters (C would read only up to the first), or None
 * (NULL) where allowed. The UTF-8 buffer is the str's own, alive while the
 * caller holds the argument. */
static int pkv_py_c_str(PyObject* v, const char* name, int allow_none, const char** out) {
  *out = NULL;
  if (v == Py_None && allow_none) return 1;
  if (!PyUnicode_Check(v)) {
    PyErr_Format(PyExc_TypeError, "%s: expected str%s, got %s", name, allow_none ? " or None" : "",
                 Py_TYPE(v)->tp_name);
    return 0;
  }
  Py_ssize_t len = 0;
  const char* s = pkv_py_utf8(v, "", name, -1, &len);
  if (!s) return 0;
  if (strlen(s) != (size_t)len) {
    PyErr_Format(PyExc_ValueError, "%s: embedded null character", name);
    return 0;
  }
  *out = s;
  return 1;
}

/* A sequence of floats -> a float array owned by a bytes object kept in
 * keep (alive for the call); *n its length. None/absent: NULL, 0. */
static int pkv_py_floats(PyObject* v, const char* name, PyObject* keep, const float** out,
                         Py_ssize_t* n) {
  *out = NULL;
  *n = 0;
  if (!v || v == Py_None) return 1;
  PyObject* seq = pkv_py_items(v, "expected a sequence of floats");
  if (!seq) return 0;
  const Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
  PyObject* store = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(float) * (len > 0 ? len : 1));
  if (!store) {
    Py_DECREF(seq);
    return 0;
  }
  float* arr = (float*)PyBytes_AS_STRING(store);
  for (Py_ssize_t i = 0; i < len; ++i) {
    const double x = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
    if (x == -1.0 && PyErr_Occurred()) {
      PyErr_Format(PyExc_TypeError, "%s[%zd]: expected a float", name, i);
      Py_DECREF(seq);
      Py_DECREF(store);
      return 0;
    }
    arr[i] = (float)x;
  }
  Py_DECREF(seq);
  const int rc = PyList_Append(keep, store);
  Py_DECREF(store);
  if (rc != 0) return 0;
  *out = arr;
  *n = len;
  return 1;
}

/* Pool options k_scales / v_scales: float sequences of one length, which
 * becomes num_kv_scales (so the count can never exceed the arrays). */
static int pkv_py_dict_scales(PyObject* dict, PyObject* keep, pkv_pool_options* o) {
  Py_ssize_t nk = 0, nv = 0;
  if (!pkv_py_floats(PyDict_GetItemString(dict, "k_scales"), "k_scales", keep, &o->k_scales, &nk))
    return 0;
  if (!pkv_py_floats(PyDict_GetItemString(dict, "v_scales"), "v_scales", keep, &o->v_scales, &nv))
    return 0;
  if (nk != nv || nk > 0xffffffffLL) {
    pkv_py_raise_status(PKV_E_INVALID_ARGUMENT,
                        PyUnicode_FromFormat("k_scales and v_scales differ in length (%zd vs %zd)",
                                             nk, nv));
    return 0;
  }
  if (o->k_scales || o->v_scales) o->num_kv_scales = (uint32_t)nk;
  return 1;
}

/* An int in [0, 2^64 - 1] (an int or any object with __index__, such as
 * numpy's integers), named "<name>[i].<field>" ("<name>.<field>" for i < 0)
 * in the TypeError of another object and the OverflowError of an int
 * outside that range. */
static int pkv_py_u64(PyObject* v, const char* name, Py_ssize_t i, const char* field,
                      unsigned long long* out) {
  char at[32] = "";
  if (i >= 0) PyOS_snprintf(at, sizeof at, "[%zd]", i);
  if (!PyIndex_Check(v)) {
    PyErr_Format(PyExc_TypeError, "%s%s.%s: expected an int, got %s", name, at, field,
                 Py_TYPE(v)->tp_name);
    return 0;
  }
  PyObject* idx = PyNumber_Index(v);
  if (!idx) {
    /* An __index__ that refuses (a float torch tensor: "only integer tensors
     * of a single element can be converted to an index") is named as a
     * float is, as pkv_py_long_range does. */
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "%s%s.%s: expected an int, got %s", name, at, field,
                   Py_TYPE(v)->tp_name);
    }
    return 0;
  }
  unsigned long long x = PyLong_AsUnsignedLongLong(idx);
  Py_DECREF(idx);
  if (x == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_Format(PyExc_OverflowError, "%s%s.%s: expected an int in [0, 2^64 - 1]", name, at, field);
    return 0;
  }
  *out = x;
  return 1;
}

/* mm_items: a sequence of (offset, length, hash str) -> malloc'd array. */
static int pkv_py_dict_mm(PyObject* dict, PyObject* keep, pkv_mm_item** items, uint32_t* n) {
  PyObject* v = PyDict_GetItemString(dict, "mm_items");
  *items = NULL;
  *n = 0;
  if (!v || v == Py_None) return 1;
  PyObject* seq = pkv_py_items(v, "option mm_items: expected a sequence of (offset, length, hash)");
  if (!seq) return 0;
  Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
  pkv_mm_item* arr = (pkv_mm_item*)calloc((size_t)(len > 0 ? len : 1), sizeof(pkv_mm_item));
  if (!arr) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return 0;
  }
  for (Py_ssize_t i = 0; i < len; ++i) {
    PyObject* it = PySequence_Fast_GET_ITEM(seq, i);
    unsigned long long off = 0, ln = 0;
    PyObject *po, *pl, *h;
    if (!PyTuple_Check(it) || !PyArg_ParseTuple(it, "OOU", &po, &pl, &h) ||
        !PyIndex_Check(po) || !PyIndex_Check(pl)) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "option mm_items[%zd]: expected (offset, length, hash str)", i);
      free(arr);
      Py_DECREF(seq);
      return 0;
    }
    /* Range checked: "K" took them modulo 2^64, so an item at offset
     * 2^64 + 3 keyed the blocks as one at 3, and one at -5 was accepted. */
    if (!pkv_py_u64(po, "option mm_items", i, "offset", &off) ||
        !pkv_py_u64(pl, "option mm_items", i, "length", &ln)) {
      free(arr);
      Py_DECREF(seq);
      return 0;
    }
    Py_ssize_t hl = 0;
    const char* hs = pkv_py_utf8(h, "option ", "mm_items", i, &hl);
    if (hs && strlen(hs) != (size_t)hl) {
      PyErr_Format(PyExc_ValueError, "option mm_items[%zd]: embedded null character in the hash", i);
      hs = NULL;
    }
    if (!hs || PyList_Append(keep, h) != 0) {
      free(arr);
      Py_DECREF(seq);
      return 0;
    }
    arr[i].offset = off;
    arr[i].length = ln;
    arr[i].hash = hs;
  }
  Py_DECREF(seq);
  *items = arr;
  *n = (uint32_t)len;
  return 1;
}

static PyObject* pkv_py_hash_list(const pkv_block_hash* h, uint64_t n) {
  PyObject* list = PyList_New((Py_ssize_t)n);
  if (!list) return NULL;
  for (uint64_t i = 0; i < n; ++i) {
    PyObject* b = PyBytes_FromStringAndSize((const char*)h[i].bytes, PKV_HASH_MAX_BYTES);
    if (!b) {
      Py_DECREF(list);
      return NULL;
    }
    PyList_SET_ITEM(list, (Py_ssize_t)i, b);
  }
  return list;
}
%}

/* ------------------------------------------------------ integer scalars */

/* Every integer parameter and struct field (uint32_t, int32_t, uint64_t,
 * pkv_seq_id, size_t...: the typemaps are on the C types the stdint.i
 * typedefs reduce to). The values accepted are SWIG's own conversion's: an
 * int (bool and other int subclasses included) within the type's range;
 * numpy's integer scalars are not ints and stay a TypeError here (the
 * package takes them through operator.index). A bad value raises what
 * SWIG raised, OverflowError for an int out of range and TypeError for
 * anything else, but naming the function, the parameter (a setter: the
 * struct and field), the range and the value given: SWIG's "in method
 * 'pkv_seq_append', argument 5 of type 'uint32_t'" named none of them
 * (and counted C arguments, not Python ones). */

%define PKV_UINT_IN(CTYPE, HI, RANGE)
%typemap(in) CTYPE {
  unsigned long long v_ = 0;
  if (!pkv_py_arg_u($input, HI, &v_)) {
    pkv_py_int_arg_error($input, "$symname", "$1_name", "$1_type", RANGE);
    SWIG_fail;
  }
  $1 = ($1_ltype)v_;
}
%enddef
%define PKV_SINT_IN(CTYPE, LO, HI, RANGE)
%typemap(in) CTYPE {
  long long v_ = 0;
  if (!pkv_py_arg_s($input, LO, HI, &v_)) {
    pkv_py_int_arg_error($input, "$symname", "$1_name", "$1_type", RANGE);
    SWIG_fail;
  }
  $1 = ($1_ltype)v_;
}
%enddef
PKV_UINT_IN(unsigned char, UCHAR_MAX, "[0, 255]")
PKV_UINT_IN(unsigned short, USHRT_MAX, "[0, 65535]")
PKV_UINT_IN(unsigned int, UINT_MAX, "[0, 2^32 - 1]")
PKV_UINT_IN(unsigned long, ULONG_MAX, ULONG_MAX > UINT_MAX ? "[0, 2^64 - 1]" : "[0, 2^32 - 1]")
PKV_UINT_IN(unsigned long long, ULLONG_MAX, "[0, 2^64 - 1]")
PKV_UINT_IN(size_t, SIZE_MAX, SIZE_MAX > UINT_MAX ? "[0, 2^64 - 1]" : "[0, 2^32 - 1]")
PKV_SINT_IN(signed char, SCHAR_MIN, SCHAR_MAX, "[-128, 127]")
PKV_SINT_IN(short, SHRT_MIN, SHRT_MAX, "[-32768, 32767]")
PKV_SINT_IN(int, INT_MIN, INT_MAX, "[-2^31, 2^31 - 1]")
PKV_SINT_IN(long, LONG_MIN, LONG_MAX, LONG_MAX > INT_MAX ? "[-2^63, 2^63 - 1]" : "[-2^31, 2^31 - 1]")
PKV_SINT_IN(long long, LLONG_MIN, LLONG_MAX, "[-2^63, 2^63 - 1]")

/* void* arguments: data pointers and streams. */
%typemap(in) void* data, void* stream {
  if (!pkv_py_as_ptr($input, "$1_name", (void**)&$1)) SWIG_fail;
}
%typemap(out) void* data {
  $result = PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)$1);
}
%typemap(typecheck) void* stream = void*;

/* ----------------------------------------------------------- out scalars */

/* Every argout appends through pkv_py_append, never SWIG's
 * SWIG_Python_AppendOutput: SWIG 4.3 added an is_void argument to it and,
 * for a non-void C return (our pkv_status, whose typemap leaves None), keeps
 * that None as the first list element, so one output would come back as
 * [None, value]. This has the same meaning on every SWIG (4.1 .. 4.5 tested):
 * None or nothing is replaced by the first output; a second output turns the
 * result into a list. Steals obj; on failure drops result and returns NULL. */
%{
static PyObject* pkv_py_append(PyObject* result, PyObject* obj) {
  if (!obj) {
    Py_XDECREF(result);
    return NULL;
  }
  if (!result || result == Py_None) {
    Py_XDECREF(result);
    return obj;
  }
  if (!PyList_Check(result)) {
    PyObject* list = PyList_New(1);
    if (!list) {
      Py_DECREF(result);
      Py_DECREF(obj);
      return NULL;
    }
    PyList_SET_ITEM(list, 0, result);
    result = list;
  }
  int rc = PyList_Append(result, obj);
  Py_DECREF(obj);
  if (rc != 0) {
    Py_DECREF(result);
    return NULL;
  }
  return result;
}
%}

%define PKV_OUT_U64(TYPE, NAME)
%typemap(in, numinputs=0) TYPE* NAME (TYPE tmp = 0) { $1 = &tmp; }
%typemap(argout) TYPE* NAME {
  $result = pkv_py_append($result, PyLong_FromUnsignedLongLong((unsigned long long)tmp$argnum));
  if (!$result) SWIG_fail;
}
%enddef
PKV_OUT_U64(pkv_seq_id, out)
PKV_OUT_U64(pkv_seq_id, out_child)
PKV_OUT_U64(pkv_seq_id, out_seq)
PKV_OUT_U64(uint64_t, out)
PKV_OUT_U64(uint64_t, out_num_cached)
PKV_OUT_U64(uint64_t, out_blocks)
PKV_OUT_U64(uint32_t, out)
PKV_OUT_U64(uint64_t, out_num_events)

%define PKV_OUT_HANDLE(TYPE)
%typemap(in, numinputs=0) TYPE** out (TYPE* tmp = NULL) { $1 = &tmp; }
%typemap(argout) TYPE** out {
  $result = pkv_py_append($result, SWIG_NewPointerObj(tmp$argnum, $descriptor(TYPE*), 0));
  if (!$result) SWIG_fail;
}
%enddef
PKV_OUT_HANDLE(pkv_pool)
PKV_OUT_HANDLE(pkv_batch)
PKV_OUT_HANDLE(pkv_event_publisher)
PKV_OUT_HANDLE(pkv_transfer_engine)
PKV_OUT_HANDLE(pkv_transfer)
PKV_OUT_U64(uint64_t, out_export_id)
PKV_OUT_U64(uint32_t, out_state)
PKV_OUT_U64(uint32_t, out_group)
PKV_OUT_U64(uint32_t, out_index)

/* A transfer descriptor in: any contiguous bytes-like object, copied (a
 * bytearray or array may change on another thread while the call parses
 * it without the GIL). */
%typemap(in) (const uint8_t* descriptor, uint64_t size) (Py_buffer view = pkv_py_no_buffer()) {
  view.obj = NULL;
  if (PyObject_GetBuffer($input, &view, PyBUF_C_CONTIGUOUS) != 0) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "descriptor: expected bytes, got %s", Py_TYPE($input)->tp_name);
    SWIG_fail;
  }
  $1 = ($1_ltype)pkv_py_copy_buffer(&view);
  if (!$1) SWIG_fail;
  $2 = (uint64_t)view.len;
  PyBuffer_Release(&view);
  view.obj = NULL;
}
%typemap(freearg) (const uint8_t* descriptor, uint64_t size) {
  free((void*)$1);
  if (view$argnum.obj) PyBuffer_Release(&view$argnum);
}

/* Result structs: initialised (struct_size) before the call by INIT, a
 * pkv_status expression (pkv_X_init_sized with this module's sizeof:
 * docs/conventions.md, "Versioned structs"), returned as an owned proxy
 * (malloc'd copy; the proxy's destructor frees it). */
%define PKV_OUT_STRUCT(TYPE, INIT)
%typemap(in, numinputs=0) TYPE* out (TYPE tmp) {
  memset(&tmp, 0, sizeof tmp);
  {
    const pkv_status st_ = INIT;
    if (st_ != PKV_OK) {
      pkv_py_raise(st_);
      SWIG_fail;
    }
  }
  $1 = &tmp;
}
%typemap(argout) TYPE* out {
  TYPE* copy = (TYPE*)malloc(sizeof(TYPE));
  if (!copy) {
    PyErr_NoMemory();
    SWIG_fail;
  }
  *copy = tmp$argnum;
  $result = pkv_py_append($result, SWIG_NewPointerObj(copy, $descriptor(TYPE*), SWIG_POINTER_OWN));
  if (!$result) SWIG_fail;
}
%enddef
PKV_OUT_STRUCT(pkv_pool_options, pkv_pool_options_init_sized(&tmp, sizeof tmp))
PKV_OUT_STRUCT(pkv_seq_info, pkv_seq_info_init_sized(&tmp, sizeof tmp))
PKV_OUT_STRUCT(pkv_pool_stats, pkv_pool_stats_init_sized(&tmp, sizeof tmp))
PKV_OUT_STRUCT(pkv_batch_info, pkv_batch_info_init_sized(&tmp, sizeof tmp))
PKV_OUT_STRUCT(pkv_tensor, PKV_OK)
PKV_OUT_STRUCT(pkv_prefix_match, pkv_prefix_match_init_sized(&tmp, sizeof tmp))
PKV_OUT_STRUCT(pkv_event_publisher_stats, pkv_event_publisher_stats_init_sized(&tmp, sizeof tmp))

/* pkv_pool_get_options: hash_seed points into the pool, which may be
 * destroyed while the proxy lives (reading opts.hash_seed then, or passing
 * the proxy to pkv_pool_create, read freed memory). The proxy's one
 * allocation (freed by its destructor) carries a copy of the string. */
%typemap(argout) pkv_pool_options* out {
  const char* seed_ = tmp$argnum.hash_seed ? tmp$argnum.hash_seed : "";
  const size_t seed_len_ = strlen(seed_) + 1;
  pkv_pool_options* copy = (pkv_pool_options*)malloc(sizeof(pkv_pool_options) + seed_len_);
  if (!copy) {
    PyErr_NoMemory();
    SWIG_fail;
  }
  *copy = tmp$argnum;
  memcpy((char*)(copy + 1), seed_, seed_len_);
  copy->hash_seed = (const char*)(copy + 1);
  $result = pkv_py_append($result, SWIG_NewPointerObj(copy, $descriptor(pkv_pool_options*), SWIG_POINTER_OWN));
  if (!$result) SWIG_fail;
}

/* pkv_X_init_sized(s) in Python: size is the struct's sizeof in this module,
 * which is the size of every pkv_X proxy it allocates (a caller-given size
 * could reach past the proxy's memory). None is NULL: the library's
 * InvalidArgumentError. */
%define PKV_SIZED_INIT(TYPE, NAME)
%typemap(in) (TYPE* NAME, size_t size) (void* argp = 0) {
  if (!SWIG_IsOK(SWIG_ConvertPtr($input, &argp, $descriptor(TYPE*), 0))) {
    PyErr_Format(PyExc_TypeError, "NAME: expected a TYPE, got %s", Py_TYPE($input)->tp_name);
    SWIG_fail;
  }
  $1 = (TYPE*)argp;
  $2 = sizeof(TYPE);
}
%typemap(argout) (TYPE* NAME, size_t size) "";  /* not a result struct (PKV_OUT_STRUCT) */
%enddef
PKV_SIZED_INIT(pkv_pool_options, opts)
PKV_SIZED_INIT(pkv_seq_options, opts)
PKV_SIZED_INIT(pkv_hash_options, opts)
PKV_SIZED_INIT(pkv_attention_params, params)
PKV_SIZED_INIT(pkv_batch_info, info)
PKV_SIZED_INIT(pkv_pool_stats, stats)
PKV_SIZED_INIT(pkv_seq_info, info)
PKV_SIZED_INIT(pkv_prefix_match, out)
PKV_SIZED_INIT(pkv_event_publisher_options, opts)
PKV_SIZED_INIT(pkv_event_publisher_stats, stats)
PKV_SIZED_INIT(pkv_kv_group_spec, spec)
PKV_SIZED_INIT(pkv_group_stats, stats)
PKV_SIZED_INIT(pkv_tier_options, opts)
PKV_SIZED_INIT(pkv_tier_match, out)
PKV_SIZED_INIT(pkv_tier_stats, stats)
PKV_SIZED_INIT(pkv_transfer_options, opts)

/* pkv_event_publisher_endpoint: returns the endpoint as str. */
%typemap(in, numinputs=0) (char* buf, uint64_t capacity, uint64_t* out_len)
    (char tmp[1024], uint64_t len = 0) {
  $1 = tmp;
  $2 = sizeof tmp;
  $3 = &len;
}
%typemap(argout) (char* buf, uint64_t capacity, uint64_t* out_len) {
  $result = pkv_py_append($result, PyUnicode_FromStringAndSize($1, (Py_ssize_t)len$argnum));
  if (!$result) SWIG_fail;
}

/* pkv_pool_drain_events_v2: takes (capacity, token_capacity), returns a
 * list of (pkv_event_v2, [token ids]). */
%typemap(in) (pkv_event_v2* out, uint64_t capacity, int32_t* token_buf, uint64_t token_capacity,
              uint64_t* out_count) (uint64_t count = 0) {
  unsigned long long cap = 0, tcap = 0;
  PyObject *pc = NULL, *pt = NULL;
  /* Range checked ("KK" took them modulo 2^64). */
  if (!PyArg_ParseTuple($input, "OO", &pc, &pt)) SWIG_fail;
  if (!pkv_py_u64(pc, "drain_events_v2", -1, "capacity", &cap) ||
      !pkv_py_u64(pt, "drain_events_v2", -1, "token_capacity", &tcap))
    SWIG_fail;
  if (cap > (1u << 20) || tcap > (1u << 26)) {
    PyErr_SetString(PyExc_ValueError, "drain_events_v2: capacity or token_capacity too large");
    SWIG_fail;
  }
  $2 = cap;
  $4 = tcap;
  $1 = (pkv_event_v2*)calloc((size_t)(cap > 0 ? cap : 1), sizeof(pkv_event_v2));
  $3 = (int32_t*)calloc((size_t)(tcap > 0 ? tcap : 1), sizeof(int32_t));
  if (!$1 || !$3) { PyErr_NoMemory(); SWIG_fail; }
  for (size_t i = 0; i < (size_t)cap; ++i) $1[i].struct_size = sizeof(pkv_event_v2);
  $5 = &count;
}
%typemap(argout) (pkv_event_v2* out, uint64_t capacity, int32_t* token_buf, uint64_t token_capacity,
                  uint64_t* out_count) {
  uint64_t n = count$argnum < $2 ? count$argnum : $2;
  PyObject* list = PyList_New((Py_ssize_t)n);
  if (!list) SWIG_fail;
  for (uint64_t i = 0; i < n; ++i) {
    pkv_event_v2* e = (pkv_event_v2*)malloc(sizeof(pkv_event_v2));
    PyObject* ids = e ? PyList_New((Py_ssize_t)$1[i].num_token_ids) : NULL;
    if (!ids) { free(e); Py_DECREF(list); if (!PyErr_Occurred()) PyErr_NoMemory(); SWIG_fail; }
    *e = $1[i];
    for (uint32_t t = 0; t < e->num_token_ids; ++t)
      PyList_SET_ITEM(ids, (Py_ssize_t)t, PyLong_FromLong($3[e->token_offset + t]));
    PyObject* ev = SWIG_NewPointerObj(e, $descriptor(pkv_event_v2*), SWIG_POINTER_OWN);
    PyList_SET_ITEM(list, (Py_ssize_t)i, Py_BuildValue("(NN)", ev, ids));
  }
  $result = pkv_py_append($result, list);
  if (!$result) SWIG_fail;
}
%typemap(freearg) (pkv_event_v2* out, uint64_t capacity, int32_t* token_buf, uint64_t token_capacity,
                   uint64_t* out_count) { free($1); free($3); }
PKV_OUT_STRUCT(pkv_tier_match, pkv_tier_match_init_sized(&tmp, sizeof tmp))
PKV_OUT_STRUCT(pkv_tier_stats, pkv_tier_stats_init_sized(&tmp, sizeof tmp))
PKV_OUT_STRUCT(pkv_group_stats, pkv_group_stats_init_sized(&tmp, sizeof tmp))

/* pkv_hash_root's digest: bytes (PKV_HASH_MAX_BYTES, zero-padded). */
%typemap(in, numinputs=0) pkv_block_hash* out (pkv_block_hash tmp) {
  memset(&tmp, 0, sizeof tmp);
  $1 = &tmp;
}
%typemap(argout) pkv_block_hash* out {
  $result = pkv_py_append($result,
      PyBytes_FromStringAndSize((const char*)tmp$argnum.bytes, PKV_HASH_MAX_BYTES));
  if (!$result) SWIG_fail;
}

/* ------------------------------------------- (buffer, capacity, &len) outs */

%{
/* No block table or copy list holds more than 2^31 entries (a sequence
 * holds at most 2^31 - 1 tokens, a pool 2^30 blocks): a larger capacity is
 * clamped, the result being the same. Unclamped, capacity * 4 bytes wrapped
 * (2^62: malloc(0)) and the library wrote the table past the allocation. */
#define PKV_PY_MAX_TABLE (1ULL << 31)
%}
%typemap(in) (int32_t* out_blocks, uint64_t capacity, uint64_t* out_len) (uint64_t len = 0) {
  unsigned long long cap = 0;
  if (!pkv_py_u64_arg($input, "$symname", "capacity", &cap)) SWIG_fail;
  if (cap > PKV_PY_MAX_TABLE) cap = PKV_PY_MAX_TABLE;
  $2 = cap;
  $1 = (int32_t*)calloc((size_t)(cap > 0 ? cap : 1), sizeof(int32_t));
  if (!$1) { PyErr_NoMemory(); SWIG_fail; }
  $3 = &len;
}
%typemap(argout) (int32_t* out_blocks, uint64_t capacity, uint64_t* out_len) {
  uint64_t n = len$argnum < $2 ? len$argnum : $2;
  PyObject* list = PyList_New((Py_ssize_t)n);
  if (!list) SWIG_fail;
  for (uint64_t i = 0; i < n; ++i) PyList_SET_ITEM(list, (Py_ssize_t)i, PyLong_FromLong($1[i]));
  $result = pkv_py_append($result, list);
  if (!$result) SWIG_fail;
}
%typemap(freearg) (int32_t* out_blocks, uint64_t capacity, uint64_t* out_len) { free($1); }

%typemap(in) (pkv_block_hash* out_hashes, uint64_t capacity, uint64_t* out_len) (uint64_t len = 0) {
  unsigned long long cap = 0;
  if (!pkv_py_u64_arg($input, "$symname", "capacity", &cap)) SWIG_fail;
  if (cap > PKV_PY_MAX_TABLE) cap = PKV_PY_MAX_TABLE;  /* as the block tables' */
  $2 = cap;
  $1 = (pkv_block_hash*)calloc((size_t)(cap > 0 ? cap : 1), sizeof(pkv_block_hash));
  if (!$1) { PyErr_NoMemory(); SWIG_fail; }
  $3 = &len;
}
%typemap(argout) (pkv_block_hash* out_hashes, uint64_t capacity, uint64_t* out_len) {
  PyObject* list = pkv_py_hash_list($1, len$argnum < $2 ? len$argnum : $2);
  if (!list) SWIG_fail;
  $result = pkv_py_append($result, list);
  if (!$result) SWIG_fail;
}
%typemap(freearg) (pkv_block_hash* out_hashes, uint64_t capacity, uint64_t* out_len) { free($1); }
%apply (pkv_block_hash* out_hashes, uint64_t capacity, uint64_t* out_len) {
  (pkv_block_hash* out_hashes, uint64_t capacity, uint64_t* out_num_blocks) };

%typemap(in) (pkv_event* out, uint64_t capacity, uint64_t* out_count) (uint64_t count = 0) {
  unsigned long long cap = 0;
  if (!pkv_py_u64_arg($input, "$symname", "capacity", &cap)) SWIG_fail;
  $2 = cap;
  $1 = (pkv_event*)calloc((size_t)(cap > 0 ? cap : 1), sizeof(pkv_event));
  if (!$1) { PyErr_NoMemory(); SWIG_fail; }
  $3 = &count;
}
%typemap(argout) (pkv_event* out, uint64_t capacity, uint64_t* out_count) {
  uint64_t n = count$argnum < $2 ? count$argnum : $2;
  PyObject* list = PyList_New((Py_ssize_t)n);
  if (!list) SWIG_fail;
  for (uint64_t i = 0; i < n; ++i) {
    pkv_event* e = (pkv_event*)malloc(sizeof(pkv_event));
    if (!e) { Py_DECREF(list); PyErr_NoMemory(); SWIG_fail; }
    *e = $1[i];
    PyList_SET_ITEM(list, (Py_ssize_t)i, SWIG_NewPointerObj(e, $descriptor(pkv_event*), SWIG_POINTER_OWN));
  }
  $result = pkv_py_append($result, list);
  if (!$result) SWIG_fail;
}
%typemap(freearg) (pkv_event* out, uint64_t capacity, uint64_t* out_count) { free($1); }

/* pkv_pool_get_priority_counts: takes the capacity, returns a list of ints. */
%typemap(in) (uint64_t* out_counts, uint64_t capacity, uint64_t* out_len) (uint64_t len = 0) {
  unsigned long long cap = 0;
  if (!pkv_py_u64_arg($input, "$symname", "capacity", &cap)) SWIG_fail;
  $2 = cap;
  $1 = (uint64_t*)calloc((size_t)(cap > 0 && cap < 4096 ? cap : 1), sizeof(uint64_t));
  if (!$1) { PyErr_NoMemory(); SWIG_fail; }
  if (cap >= 4096) $2 = 1;  /* a bogus capacity still reports the size needed */
  $3 = &len;
}
%typemap(argout) (uint64_t* out_counts, uint64_t capacity, uint64_t* out_len) {
  uint64_t n = len$argnum < $2 ? len$argnum : $2;
  PyObject* list = PyList_New((Py_ssize_t)n);
  if (!list) SWIG_fail;
  for (uint64_t i = 0; i < n; ++i)
    PyList_SET_ITEM(list, (Py_ssize_t)i, PyLong_FromUnsignedLongLong((unsigned long long)$1[i]));
  $result = pkv_py_append($result, list);
  if (!$result) SWIG_fail;
}
%typemap(freearg) (uint64_t* out_counts, uint64_t capacity, uint64_t* out_len) { free($1); }

/* pkv_seq_set_retention's ranges: a sequence of (token_begin, token_end,
 * priority, duration_ns) tuples. */
%typemap(in) (const pkv_retention_range* ranges, uint64_t num_ranges) (pkv_retention_range* rs = NULL) {
  /* More than the library takes is refused before anything is read. */
  PyObject* seq = pkv_py_items_max($input, "ranges", PKV_RETENTION_MAX_RANGES,
                                   "ranges: expected a sequence of (begin, end, priority, duration_ns)");
  if (!seq) SWIG_fail;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  rs = (pkv_retention_range*)calloc((size_t)(n > 0 ? n : 1), sizeof(pkv_retention_range));
  if (!rs) { Py_DECREF(seq); PyErr_NoMemory(); SWIG_fail; }
  for (Py_ssize_t i = 0; i < n && !PyErr_Occurred(); ++i) {
    PyObject* t = PySequence_Fast_GET_ITEM(seq, i);
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4) {
      PyErr_Format(PyExc_TypeError, "ranges[%zd]: expected a tuple (begin, end, priority, duration_ns)", i);
      break;
    }
    /* Any integer (numpy's too, as RetentionRange takes), a bad one named
     * by range and field (PyLong_AsUnsignedLongLong said only "an integer
     * is required"). */
    unsigned long long v[4];
    static const char* const fields[4] = {"token_begin", "token_end", "priority", "duration_ns"};
    int ok = 1;
    for (int f = 0; f < 4 && ok; ++f) ok = pkv_py_u64(PyTuple_GET_ITEM(t, f), "ranges", i, fields[f], &v[f]);
    if (!ok) break;
    rs[i].token_begin = v[0];
    rs[i].token_end = v[1];
    /* a priority beyond 32 bits is the library's to refuse, not truncated */
    rs[i].priority = v[2] > 0xffffffffULL ? 0xffffffffu : (uint32_t)v[2];
    rs[i].duration_ns = v[3];
  }
  Py_DECREF(seq);
  if (PyErr_Occurred()) SWIG_fail;
  $1 = rs;
  $2 = (uint64_t)n;
}
%typemap(freearg) (const pkv_retention_range* ranges, uint64_t num_ranges) { free(rs$argnum); }

/* pkv_last_error_copy(buf, capacity): takes the capacity, returns
 * [full length, copied text]. */
%typemap(in) (char* buf, uint64_t capacity) {
  unsigned long long cap = 0;
  if (!pkv_py_u64_arg($input, "$symname", "capacity", &cap)) SWIG_fail;
  /* At most what the message needs (its length + 1; the result is the
   * same for any larger capacity): malloc(capacity + 1) was a MemoryError
   * at 2^40 and wrapped to malloc(0) at 2^64 - 1, into which the library
   * then copied the message (heap overflow, the interpreter aborted). */
  const uint64_t need_ = pkv_last_error_copy(NULL, 0) + 1;
  $2 = cap < need_ ? cap : need_;
  $1 = (char*)malloc((size_t)$2 + 1);
  if (!$1) { PyErr_NoMemory(); SWIG_fail; }
  $1[0] = 0;
}
%typemap(argout) (char* buf, uint64_t capacity) {
  $result = pkv_py_append($result, PyUnicode_DecodeUTF8($1, (Py_ssize_t)strlen($1), "replace"));
  if (!$result) SWIG_fail;
}
%typemap(freearg) (char* buf, uint64_t capacity) { free($1); }

/* ------------------------------------------------------------- array ins */

%typemap(in) (const int32_t* tokens, uint64_t num_tokens) (Py_buffer view = pkv_py_no_buffer(), int owned = 0) {
  view.obj = NULL;
  if (!pkv_py_int32_array($input, "$1_name", PKV_PY_MAX_TOKENS, (int32_t**)&$1, &$2, &view, &owned)) SWIG_fail;
}
%typemap(freearg) (const int32_t* tokens, uint64_t num_tokens) {
  if ($1 || view$argnum.obj) pkv_py_int32_release((int32_t*)$1, &view$argnum, owned$argnum);
}
%apply (const int32_t* tokens, uint64_t num_tokens) { (const int32_t* blocks, uint64_t num_blocks) };

/* Sequence ids: copied from a contiguous 8-byte integer buffer (numpy
 * uint64/int64, array('Q'): one memcpy) or a sequence of ints; never
 * borrowed (see pkv_py_int32_array_from). */
%{
static int pkv_py_seq_ids(PyObject* obj, const char* name, pkv_seq_id** data, uint64_t* n,
                          Py_buffer* view, int* owned) {
  *owned = 0;
  view->obj = NULL;
  if (PyObject_CheckBuffer(obj) &&
      PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
    const char* f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') ++f;
    if (view->itemsize == 8 && view->ndim <= 1 && pkv_py_int_format(f, 8)) {
      if ((long long)(view->len / 8) > PKV_PY_MAX_SEQS) {
        PyBuffer_Release(view);
        view->obj = NULL;
        return pkv_py_too_many(name, (long long)(view->len / 8), PKV_PY_MAX_SEQS);
      }
      pkv_seq_id* ids = (pkv_seq_id*)pkv_py_copy_buffer(view);
      if (!ids) return 0;
      *data = ids;
      *n = (uint64_t)(view->len / 8);
      PyBuffer_Release(view);
      view->obj = NULL;
      *owned = 1;
      return 1;
    }
    PyBuffer_Release(view);
    view->obj = NULL;
  }
  PyErr_Clear();
  /* A strided 1-d buffer of 8-byte ints (a numpy slice of ids): copied
   * element by element, as the contiguous one (see pkv_py_int32_array_from). */
  if (PyObject_CheckBuffer(obj) &&
      PyObject_GetBuffer(obj, view, PyBUF_STRIDES | PyBUF_FORMAT) == 0) {
    const char* f = view->format ? view->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') ++f;
    if (view->itemsize == 8 && view->ndim == 1 && pkv_py_int_format(f, 8)) {
      const Py_ssize_t len = view->shape[0], step = view->strides[0];
      if ((long long)len > PKV_PY_MAX_SEQS) { /* a broadcast: its length costs it no memory */
        PyBuffer_Release(view);
        view->obj = NULL;
        return pkv_py_too_many(name, (long long)len, PKV_PY_MAX_SEQS);
      }
      /* calloc checks the product (a broadcast's length is not bounded by memory) */
      pkv_seq_id* ids = (pkv_seq_id*)calloc((size_t)(len > 0 ? len : 1), sizeof(pkv_seq_id));
      if (!ids) {
        PyBuffer_Release(view);
        view->obj = NULL;
        PyErr_NoMemory();
        return 0;
      }
      for (Py_ssize_t i = 0; i < len; ++i) memcpy(&ids[i], (const char*)view->buf + i * step, 8);
      PyBuffer_Release(view);
      view->obj = NULL;
      *data = ids;
      *n = (uint64_t)len;
      *owned = 1;
      return 1;
    }
    PyBuffer_Release(view);
    view->obj = NULL;
  }
  PyErr_Clear();
  Py_ssize_t len = 0;
  *data = (pkv_seq_id*)pkv_py_uint_array(obj, name, 8, ~0ULL, PKV_PY_MAX_SEQS, &len);
  if (!*data) return 0;
  *n = (uint64_t)len;
  *owned = 1;
  return 1;
}

static void pkv_py_seq_ids_release(pkv_seq_id* data, Py_buffer* view, int owned) {
  if (owned) free(data);
  if (view->obj) PyBuffer_Release(view);
}
%}

%typemap(in) (const pkv_seq_id* seqs, uint64_t num_seqs) (Py_buffer view = pkv_py_no_buffer(), int owned = 0) {
  view.obj = NULL;
  if (!pkv_py_seq_ids($input, "seqs", (pkv_seq_id**)&$1, &$2, &view, &owned)) SWIG_fail;
}
%typemap(freearg) (const pkv_seq_id* seqs, uint64_t num_seqs) {
  if ($1 || view$argnum.obj) pkv_py_seq_ids_release((pkv_seq_id*)$1, &view$argnum, owned$argnum);
}

/* pkv_seq_append_batch: one argument (seqs, tokens) of equal length. */
%typemap(in) (const pkv_seq_id* seqs, const int32_t* tokens, uint64_t num_seqs)
    (Py_buffer sv = pkv_py_no_buffer(), Py_buffer tv = pkv_py_no_buffer(), int sown = 0, int town = 0, uint64_t ns = 0, uint64_t nt = 0) {
  sv.obj = NULL;
  tv.obj = NULL;
  if (!PyTuple_Check($input) || PyTuple_GET_SIZE($input) != 2) {
    PyErr_SetString(PyExc_TypeError, "batch: expected a tuple (seq ids, token ids)");
    SWIG_fail;
  }
  if (!pkv_py_seq_ids(PyTuple_GET_ITEM($input, 0), "seqs", (pkv_seq_id**)&$1, &ns, &sv, &sown)) SWIG_fail;
  if (!pkv_py_int32_array(PyTuple_GET_ITEM($input, 1), "tokens", PKV_PY_MAX_SEQS, (int32_t**)&$2, &nt, &tv, &town)) SWIG_fail;
  if (ns != nt) {
    pkv_py_raise_status(PKV_E_INVALID_ARGUMENT,
                        PyUnicode_FromFormat("seqs and tokens differ in length (%llu vs %llu)",
                                             (unsigned long long)ns, (unsigned long long)nt));
    SWIG_fail;
  }
  $3 = ns;
}
%typemap(freearg) (const pkv_seq_id* seqs, const int32_t* tokens, uint64_t num_seqs) {
  if ($1 || sv$argnum.obj) pkv_py_seq_ids_release((pkv_seq_id*)$1, &sv$argnum, sown$argnum);
  if ($2 || tv$argnum.obj) pkv_py_int32_release((int32_t*)$2, &tv$argnum, town$argnum);
}

/* pkv_batch_prepare_decode: one argument (seqs, tokens) of equal length,
 * both as for pkv_seq_append_batch (uint64 ids and int32 tokens copied
 * from a buffer with one memcpy); a length mismatch raises InvalidArgumentError before the
 * call. */
%typemap(in) (const pkv_seq_id* seqs, const int32_t* tokens, uint32_t num_seqs)
    (Py_buffer sv = pkv_py_no_buffer(), Py_buffer tv = pkv_py_no_buffer(), int sown = 0, int town = 0, uint64_t ns = 0, uint64_t nt = 0) {
  sv.obj = NULL;
  tv.obj = NULL;
  if (!PyTuple_Check($input) || PyTuple_GET_SIZE($input) != 2) {
    PyErr_SetString(PyExc_TypeError, "decode: expected a tuple (seq ids, token ids)");
    SWIG_fail;
  }
  if (!pkv_py_seq_ids(PyTuple_GET_ITEM($input, 0), "seqs", (pkv_seq_id**)&$1, &ns, &sv, &sown)) SWIG_fail;
  if (!pkv_py_int32_array(PyTuple_GET_ITEM($input, 1), "tokens", PKV_PY_MAX_SEQS, (int32_t**)&$2, &nt, &tv, &town)) SWIG_fail;
  if (ns != nt || ns > 0xffffffffULL) {
    PyObject* cls = pkv_py_error_classes[-PKV_E_INVALID_ARGUMENT];
    PyObject* msg = ns != nt
        ? PyUnicode_FromFormat("seqs and tokens differ in length (%llu vs %llu)",
                               (unsigned long long)ns, (unsigned long long)nt)
        : PyUnicode_FromFormat("%llu sequences exceed 2^32 - 1", (unsigned long long)ns);
    PyObject* exc = cls && msg ? PyObject_CallFunction(cls, "Oi", msg, (int)PKV_E_INVALID_ARGUMENT) : NULL;
    if (exc) {
      PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
      Py_DECREF(exc);
    } else if (msg && !PyErr_Occurred()) {
      PyErr_SetObject(PyExc_ValueError, msg);
    }
    Py_XDECREF(msg);
    SWIG_fail;
  }
  $3 = (uint32_t)ns;
}
%typemap(freearg) (const pkv_seq_id* seqs, const int32_t* tokens, uint32_t num_seqs) {
  if ($1 || sv$argnum.obj) pkv_py_seq_ids_release((pkv_seq_id*)$1, &sv$argnum, sown$argnum);
  if ($2 || tv$argnum.obj) pkv_py_int32_release((int32_t*)$2, &tv$argnum, town$argnum);
}

/* Block hashes: None (NULL), a contiguous buffer of num_hashes * 32 bytes
 * (copied), or a sequence of bytes of at most 32 each (zero-padded, as
 * pkv_hash_prefix and Pool.hash_prefix give them). */
%typemap(in) (const pkv_block_hash* hashes, uint64_t num_hashes) (Py_buffer view = pkv_py_no_buffer(), int owned = 0) {
  view.obj = NULL;
  if ($input == Py_None) {
    $1 = NULL;
    $2 = 0;
  } else if (!PyList_Check($input) && !PyTuple_Check($input) && PyObject_CheckBuffer($input) &&
             PyObject_GetBuffer($input, &view, PyBUF_C_CONTIGUOUS) == 0) {
    if ((long long)(view.len / PKV_HASH_MAX_BYTES) > PKV_PY_MAX_TOKENS) {
      pkv_py_too_many("hashes", (long long)(view.len / PKV_HASH_MAX_BYTES), PKV_PY_MAX_TOKENS);
      SWIG_fail;
    }
    if (view.len % PKV_HASH_MAX_BYTES != 0) {
      pkv_py_raise_status(PKV_E_INVALID_ARGUMENT,
                          PyUnicode_FromFormat("hashes: a buffer of %zd bytes is not a whole number of %d-byte hashes",
                                               view.len, PKV_HASH_MAX_BYTES));
      SWIG_fail;
    }
    $1 = (pkv_block_hash*)pkv_py_copy_buffer(&view);  /* a copy: see pkv_py_int32_array_from */
    if (!$1) SWIG_fail;
    owned = 1;
    $2 = (uint64_t)(view.len / PKV_HASH_MAX_BYTES);
    PyBuffer_Release(&view);
    view.obj = NULL;
  } else {
    PyErr_Clear();
    PyObject* seq = pkv_py_items_max($input, "hashes", PKV_PY_MAX_TOKENS,
                                     "hashes: expected None, bytes or a sequence of bytes");
    if (!seq) SWIG_fail;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    pkv_block_hash* arr = (pkv_block_hash*)calloc((size_t)(len > 0 ? len : 1), sizeof(pkv_block_hash));
    if (!arr) { Py_DECREF(seq); PyErr_NoMemory(); SWIG_fail; }
    for (Py_ssize_t i = 0; i < len; ++i) {
      char* b;
      Py_ssize_t bl;
      if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(seq, i), &b, &bl) != 0 || bl > PKV_HASH_MAX_BYTES) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "hashes[%zd]: expected bytes of at most %d", i, PKV_HASH_MAX_BYTES);
        free(arr);
        Py_DECREF(seq);
        SWIG_fail;
      }
      memcpy(arr[i].bytes, b, (size_t)bl);
    }
    Py_DECREF(seq);
    $1 = arr;
    $2 = (uint64_t)len;
    owned = 1;
  }
}
%typemap(freearg) (const pkv_block_hash* hashes, uint64_t num_hashes) {
  if (owned$argnum) free((void*)$1);
  if (view$argnum.obj) PyBuffer_Release(&view$argnum);
}

/* pkv_pool_copy_blocks: one argument (src, dst), two equally long int
 * sequences. */
%typemap(in) (const int32_t* src, const int32_t* dst, uint64_t num_pairs)
    (Py_buffer sv = pkv_py_no_buffer(), Py_buffer dv = pkv_py_no_buffer(), int sown = 0, int down = 0, uint64_t ns = 0, uint64_t nd = 0) {
  sv.obj = NULL;
  dv.obj = NULL;
  if (!PyTuple_Check($input) || PyTuple_GET_SIZE($input) != 2) {
    PyErr_SetString(PyExc_TypeError, "pairs: expected a tuple (src, dst) of two int sequences");
    SWIG_fail;
  }
  if (!pkv_py_int32_array(PyTuple_GET_ITEM($input, 0), "src", PKV_PY_MAX_TOKENS, (int32_t**)&$1, &ns, &sv, &sown)) SWIG_fail;
  if (!pkv_py_int32_array(PyTuple_GET_ITEM($input, 1), "dst", PKV_PY_MAX_TOKENS, (int32_t**)&$2, &nd, &dv, &down)) SWIG_fail;
  if (ns != nd) {
    pkv_py_raise_status(PKV_E_INVALID_ARGUMENT,
                        PyUnicode_FromFormat("src and dst differ in length (%llu vs %llu)",
                                             (unsigned long long)ns, (unsigned long long)nd));
    SWIG_fail;
  }
  $3 = ns;
}
%typemap(freearg) (const int32_t* src, const int32_t* dst, uint64_t num_pairs) {
  if ($1 || sv$argnum.obj) pkv_py_int32_release((int32_t*)$1, &sv$argnum, sown$argnum);
  if ($2 || dv$argnum.obj) pkv_py_int32_release((int32_t*)$2, &dv$argnum, down$argnum);
}

/* pkv_pool_set_kv_scales: one argument (k_scales, v_scales), two equally
 * long float sequences. */
%typemap(in) (const float* k_scales, const float* v_scales, uint64_t num_scales)
    (PyObject* keep = NULL, Py_ssize_t nk = 0, Py_ssize_t nv = 0) {
  if (!PyTuple_Check($input) || PyTuple_GET_SIZE($input) != 2) {
    PyErr_SetString(PyExc_TypeError, "scales: expected a tuple (k_scales, v_scales) of two float sequences");
    SWIG_fail;
  }
  keep = PyList_New(0);
  if (!keep) SWIG_fail;
  if (!pkv_py_floats(PyTuple_GET_ITEM($input, 0), "k_scales", keep, (const float**)&$1, &nk)) SWIG_fail;
  if (!pkv_py_floats(PyTuple_GET_ITEM($input, 1), "v_scales", keep, (const float**)&$2, &nv)) SWIG_fail;
  if (nk != nv) {
    pkv_py_raise_status(PKV_E_INVALID_ARGUMENT,
                        PyUnicode_FromFormat("k_scales and v_scales differ in length (%zd vs %zd)",
                                             nk, nv));
    SWIG_fail;
  }
  $3 = (uint64_t)nk;
}
%typemap(freearg) (const float* k_scales, const float* v_scales, uint64_t num_scales) {
  Py_XDECREF(keep$argnum);
}

/* pkv_pool_get_kv_scales: takes the capacity, returns (k list, v list). */
%typemap(in) (float* k_out, float* v_out, uint64_t capacity, uint64_t* out_len) (uint64_t len = 0) {
  unsigned long long cap = 0;
  if (!pkv_py_u64_arg($input, "$symname", "capacity", &cap)) SWIG_fail;
  if (cap > (1ULL << 28)) cap = 1ULL << 28;  /* more scales than any pool has */
  $3 = cap;
  $1 = (float*)calloc((size_t)(cap > 0 ? cap : 1), sizeof(float));
  $2 = (float*)calloc((size_t)(cap > 0 ? cap : 1), sizeof(float));
  if (!$1 || !$2) { PyErr_NoMemory(); SWIG_fail; }
  $4 = &len;
}
%typemap(argout) (float* k_out, float* v_out, uint64_t capacity, uint64_t* out_len) {
  uint64_t n = len$argnum < $3 ? len$argnum : $3;
  PyObject* kl = PyList_New((Py_ssize_t)n);
  PyObject* vl = PyList_New((Py_ssize_t)n);
  if (!kl || !vl) { Py_XDECREF(kl); Py_XDECREF(vl); SWIG_fail; }
  for (uint64_t i = 0; i < n; ++i) {
    PyList_SET_ITEM(kl, (Py_ssize_t)i, PyFloat_FromDouble($1[i]));
    PyList_SET_ITEM(vl, (Py_ssize_t)i, PyFloat_FromDouble($2[i]));
  }
  $result = pkv_py_append($result, Py_BuildValue("(NN)", kl, vl));
  if (!$result) SWIG_fail;
}
%typemap(freearg) (float* k_out, float* v_out, uint64_t capacity, uint64_t* out_len) {
  free($1);
  free($2);
}

/* pkv_batch_prepare: one argument (seqs, query_counts); the ids as for
 * pkv_seq_append_batch (a uint64 buffer is copied whole), the counts from a
 * uint32 buffer (copied whole), an int (the same count for every sequence) or
 * any sequence of ints. */
%typemap(in) (const pkv_seq_id* seqs, const uint32_t* query_counts, uint32_t num_seqs)
    (Py_buffer sv = pkv_py_no_buffer(), Py_buffer qv = pkv_py_no_buffer(), int sown = 0, int qown = 0,
     uint64_t ns = 0, Py_ssize_t nq = 0) {
  if (!PyTuple_Check($input) || PyTuple_GET_SIZE($input) != 2) {
    PyErr_SetString(PyExc_TypeError, "plan: expected a tuple (seq ids, query counts)");
    SWIG_fail;
  }
  if (!pkv_py_seq_ids(PyTuple_GET_ITEM($input, 0), "seqs", (pkv_seq_id**)&$1, &ns, &sv, &sown)) SWIG_fail;
  PyObject* qc = PyTuple_GET_ITEM($input, 1);
  if (PyLong_Check(qc)) {
    unsigned long long c = PyLong_AsUnsignedLongLong(qc);
    if (PyErr_Occurred() || c > 0xffffffffULL) {
      PyErr_Clear();
      PyErr_SetString(PyExc_OverflowError, "query_counts: expected an int in [0, 2^32 - 1]");
      SWIG_fail;
    }
    uint32_t* arr = (uint32_t*)malloc(sizeof(uint32_t) * (size_t)(ns > 0 ? ns : 1));
    if (!arr) { PyErr_NoMemory(); SWIG_fail; }
    for (uint64_t i = 0; i < ns; ++i) arr[i] = (uint32_t)c;
    $2 = arr;
    qown = 1;
    nq = (Py_ssize_t)ns;
  } else if (PyObject_CheckBuffer(qc) && PyObject_GetBuffer(qc, &qv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0 &&
             qv.itemsize == 4 && qv.ndim <= 1 && qv.format &&
             (strcmp(qv.format, "I") == 0 || strcmp(qv.format, "<I") == 0 || strcmp(qv.format, "=I") == 0)) {
    $2 = (uint32_t*)pkv_py_copy_buffer(&qv);  /* a copy: see pkv_py_int32_array_from */
    if (!$2) SWIG_fail;
    qown = 1;
    nq = qv.len / 4;
    PyBuffer_Release(&qv);
    qv.obj = NULL;
  } else {
    if (qv.obj) PyBuffer_Release(&qv);
    qv.obj = NULL;
    PyErr_Clear();
    $2 = (uint32_t*)pkv_py_uint_array(qc, "query_counts", 4, 0xffffffffULL, PKV_PY_MAX_SEQS, &nq);
    if (!$2) SWIG_fail;
    qown = 1;
  }
  if ((uint64_t)nq != ns || ns > 0xffffffffULL) {
    pkv_py_raise_status(PKV_E_INVALID_ARGUMENT,
                        PyUnicode_FromFormat("seqs and query_counts differ in length (%llu vs %zd)",
                                             (unsigned long long)ns, nq));
    SWIG_fail;
  }
  $3 = (uint32_t)ns;
}
%typemap(freearg) (const pkv_seq_id* seqs, const uint32_t* query_counts, uint32_t num_seqs) {
  if ($1 || sv$argnum.obj) pkv_py_seq_ids_release((pkv_seq_id*)$1, &sv$argnum, sown$argnum);
  if (qown$argnum) free((void*)$2);
  if (qv$argnum.obj) PyBuffer_Release(&qv$argnum);
}

/* pkv_tensor_init's (ndim, shape): one sequence of ints. */
%typemap(in) (int32_t ndim, const int64_t* shape) (Py_ssize_t nd = 0) {
  PyObject* seq = pkv_py_items($input, "shape: expected a sequence of ints");
  if (!seq) SWIG_fail;
  nd = PySequence_Fast_GET_SIZE(seq);
  $2 = (int64_t*)malloc(sizeof(int64_t) * (size_t)(nd > 0 ? nd : 1));
  if (!$2) { Py_DECREF(seq); PyErr_NoMemory(); SWIG_fail; }
  for (Py_ssize_t i = 0; i < nd; ++i) {
    if (!pkv_py_i64_item(PySequence_Fast_GET_ITEM(seq, i), "$symname", "shape", i, &((int64_t*)$2)[i])) {
      Py_DECREF(seq);
      SWIG_fail;
    }
  }
  Py_DECREF(seq);
  $1 = (int32_t)nd;
}
%typemap(freearg) (int32_t ndim, const int64_t* shape) { free((void*)$2); }

/* pkv_pool_swap_blocks' host buffer: a writable contiguous buffer, or
 * (address, nbytes) for memory Python cannot describe (pinned torch memory). */
%typemap(in) (void* host_buffer, uint64_t host_bytes) (Py_buffer view = pkv_py_no_buffer()) {
  view.obj = NULL;
  if (PyTuple_Check($input) && PyTuple_GET_SIZE($input) == 2) {
    if (!pkv_py_as_ptr(PyTuple_GET_ITEM($input, 0), "host_buffer", &$1)) SWIG_fail;
    unsigned long long nbytes_ = 0;
    if (!pkv_py_u64_arg(PyTuple_GET_ITEM($input, 1), "$symname", "host_buffer nbytes", &nbytes_)) SWIG_fail;
    $2 = nbytes_;
  } else {
    if (PyObject_GetBuffer($input, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError,
                   "host_buffer: expected a writable contiguous buffer or (address, nbytes), got %s",
                   Py_TYPE($input)->tp_name);
      SWIG_fail;
    }
    $1 = view.buf;
    $2 = (uint64_t)view.len;
  }
}
%typemap(freearg) (void* host_buffer, uint64_t host_bytes) {
  if (view$argnum.obj) PyBuffer_Release(&view$argnum);
}

/* pkv_pool_create_groups' groups: a sequence of pkv_kv_group_spec proxies
 * or dicts of their fields. A dict's "layer_ids" (None or a sequence of
 * num_layers ints) is copied into an array that lives for the call; a
 * proxy's layer_ids pointer is never followed. */
%typemap(in) (const pkv_kv_group_spec* groups, uint32_t num_groups) (PyObject* seq = NULL) {
  seq = pkv_py_items($input, "groups: expected a sequence of pkv_kv_group_spec or dicts");
  if (!seq) SWIG_fail;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > 0xFFFF) {
    PyErr_SetString(PyExc_ValueError, "groups: too many entries");
    SWIG_fail;
  }
  $2 = (uint32_t)n;
  $1 = (pkv_kv_group_spec*)calloc((size_t)(n > 0 ? n : 1), sizeof(pkv_kv_group_spec));
  if (!$1) { PyErr_NoMemory(); SWIG_fail; }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
    void* argp = 0;
    if (PyDict_Check(item)) {
      static const char* const special[] = {"layer_ids", NULL};
      const pkv_status st_ = pkv_kv_group_spec_init_sized(&$1[i], sizeof $1[i]);
      if (st_ != PKV_OK) {
        pkv_py_raise(st_);
        SWIG_fail;
      }
      if (!pkv_py_apply_dict(item, &$1[i], $descriptor(pkv_kv_group_spec*), "groups", special))
        SWIG_fail;
      PyObject* ids = PyDict_GetItemString(item, "layer_ids");  /* borrowed */
      if (ids && ids != Py_None) {
        PyObject* f = pkv_py_items(ids, "groups[i].layer_ids: expected a sequence of ints");
        if (!f) SWIG_fail;
        const Py_ssize_t m = PySequence_Fast_GET_SIZE(f);
        if (m != (Py_ssize_t)$1[i].num_layers) {
          PyErr_Format(PyExc_ValueError, "groups[%zd].layer_ids holds %zd entries, not num_layers %u",
                       i, m, $1[i].num_layers);
          Py_DECREF(f);
          SWIG_fail;
        }
        uint32_t* a = (uint32_t*)calloc((size_t)(m > 0 ? m : 1), sizeof(uint32_t));
        if (!a) { Py_DECREF(f); PyErr_NoMemory(); SWIG_fail; }
        $1[i].layer_ids = a;  /* freed by freearg, also on the failure paths below */
        for (Py_ssize_t k = 0; k < m; ++k) {
          /* Any integer (numpy's too), a bad one named (PyLong_AsUnsignedLong
           * said "an integer is required" or "can't convert negative value"). */
          PyObject* item_k = PySequence_Fast_GET_ITEM(f, k);
          long long v = 0;
          int ovf = 0;
          PyObject* idx = PyIndex_Check(item_k) ? PyNumber_Index(item_k) : NULL;
          if (idx) {
            v = PyLong_AsLongLongAndOverflow(idx, &ovf);
            Py_DECREF(idx);
          }
          if (!idx || (v == -1 && PyErr_Occurred()) || ovf || v < 0 || v > 0xFFFFFFFFll) {
            const int not_int = !idx;
            PyErr_Clear();
            if (not_int)
              PyErr_Format(PyExc_TypeError, "groups[%zd].layer_ids[%zd]: expected an int, got %s", i, k,
                           Py_TYPE(item_k)->tp_name);
            else
              PyErr_Format(PyExc_OverflowError, "groups[%zd].layer_ids[%zd] is outside [0, 2^32 - 1]", i, k);
            Py_DECREF(f);
            SWIG_fail;
          }
          a[k] = (uint32_t)v;
        }
        Py_DECREF(f);
      }
    } else if (SWIG_IsOK(SWIG_ConvertPtr(item, &argp, $descriptor(pkv_kv_group_spec*), 0))) {
      $1[i] = *(pkv_kv_group_spec*)argp;
      $1[i].layer_ids = NULL;
    } else {
      PyErr_Format(PyExc_TypeError, "groups[%zd]: expected a pkv_kv_group_spec or a dict, got %s",
                   i, Py_TYPE(item)->tp_name);
      SWIG_fail;
    }
    /* The library walks the array by groups[0].struct_size: these copies
     * lie sizeof apart, so any other size (set in a dict or on a proxy) had
     * it read the next spec at the wrong place (65536: 64 KiB past a
     * two-spec array). */
    if ($1[i].struct_size != (uint32_t)sizeof(pkv_kv_group_spec)) {
      /* InvalidArgumentError (a ValueError), as the library's own
       * struct_size check raises. */
      PyObject* cls = pkv_py_error_classes[-PKV_E_INVALID_ARGUMENT];
      PyObject* msg = PyUnicode_FromFormat(
          "groups[%zd].struct_size is %u; the specs are laid out %u bytes apart "
          "(leave struct_size as pkv_kv_group_spec_init_sized sets it)",
          i, (unsigned)$1[i].struct_size, (unsigned)sizeof(pkv_kv_group_spec));
      PyObject* exc = cls && msg ? PyObject_CallFunction(cls, "Oi", msg, (int)PKV_E_INVALID_ARGUMENT) : NULL;
      if (exc) {
        PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
        Py_DECREF(exc);
      } else if (msg && !PyErr_Occurred()) {
        PyErr_SetObject(PyExc_ValueError, msg);
      }
      Py_XDECREF(msg);
      SWIG_fail;
    }
  }
}
%typemap(freearg) (const pkv_kv_group_spec* groups, uint32_t num_groups) {
  if ($1)
    for (uint32_t i = 0; i < $2; ++i) free((void*)$1[i].layer_ids);
  free((void*)$1);
  Py_XDECREF(seq$argnum);
}
%immutable pkv_kv_group_spec::layer_ids;

/* pkv_pool_group_take_copies: returns the tuple (src list, dst list). */
%typemap(in) (int32_t* src, int32_t* dst, uint64_t capacity, uint64_t* out_len) (uint64_t len = 0) {
  unsigned long long cap = 0;
  if (!pkv_py_u64_arg($input, "$symname", "capacity", &cap)) SWIG_fail;
  if (cap > PKV_PY_MAX_TABLE) cap = PKV_PY_MAX_TABLE;  /* see the block tables' typemap */
  $3 = cap;
  $1 = (int32_t*)calloc((size_t)(cap > 0 ? cap : 1), sizeof(int32_t));
  $2 = (int32_t*)calloc((size_t)(cap > 0 ? cap : 1), sizeof(int32_t));
  if (!$1 || !$2) { PyErr_NoMemory(); SWIG_fail; }
  $4 = &len;
}
%typemap(argout) (int32_t* src, int32_t* dst, uint64_t capacity, uint64_t* out_len) {
  uint64_t n = len$argnum < $3 ? len$argnum : $3;
  PyObject* a = PyList_New((Py_ssize_t)n);
  PyObject* b = PyList_New((Py_ssize_t)n);
  if (!a || !b) { Py_XDECREF(a); Py_XDECREF(b); SWIG_fail; }
  for (uint64_t i = 0; i < n; ++i) {
    PyList_SET_ITEM(a, (Py_ssize_t)i, PyLong_FromLong($1[i]));
    PyList_SET_ITEM(b, (Py_ssize_t)i, PyLong_FromLong($2[i]));
  }
  PyObject* pair = PyTuple_Pack(2, a, b);
  Py_DECREF(a);
  Py_DECREF(b);
  if (!pair) SWIG_fail;
  $result = pkv_py_append($result, pair);
  if (!$result) SWIG_fail;
}
%typemap(freearg) (int32_t* src, int32_t* dst, uint64_t capacity, uint64_t* out_len) {
  free($1);
  free($2);
}

/* ----------------------------------------------------------- tensor ins */

%typemap(in) const pkv_tensor* (pkv_tensor tmp, void* argp = 0) {
  if ($input == Py_None) {
    $1 = NULL;
  } else if (PyTuple_Check($input)) {
    if (!pkv_py_tensor_from_tuple($input, "$1_name", &tmp)) SWIG_fail;
    $1 = &tmp;
  } else if (SWIG_IsOK(SWIG_ConvertPtr($input, &argp, $descriptor(pkv_tensor*), 0))) {
    $1 = (pkv_tensor*)argp;
  } else {
    PyErr_Format(PyExc_TypeError, "$1_name: expected None, a pkv_tensor or a tensor tuple, got %s",
                 Py_TYPE($input)->tp_name);
    SWIG_fail;
  }
}

/* -------------------------------------------------------- option structs */

%define PKV_OPTIONS_IN(TYPE, INIT, SPECIAL, FILL)
%typemap(in) const TYPE* (TYPE tmp, void* argp = 0, PyObject* keep = NULL, pkv_mm_item* mm = NULL) {
  if ($input == Py_None) {
    $1 = NULL;
  } else if (PyDict_Check($input)) {
    static const char* const special[] = SPECIAL;
    const pkv_status st_ = INIT(&tmp, sizeof tmp);
    if (st_ != PKV_OK) {
      pkv_py_raise(st_);
      SWIG_fail;
    }
    keep = PyList_New(0);
    if (!keep) SWIG_fail;
    if (!pkv_py_apply_dict($input, &tmp, $descriptor(TYPE*), "$1_name", special)) SWIG_fail;
    FILL
    $1 = &tmp;
  } else if (SWIG_IsOK(SWIG_ConvertPtr($input, &argp, $descriptor(TYPE*), 0))) {
    $1 = (TYPE*)argp;
  } else {
    PyErr_Format(PyExc_TypeError, "$1_name: expected None, a TYPE or a dict, got %s",
                 Py_TYPE($input)->tp_name);
    SWIG_fail;
  }
}
%typemap(freearg) const TYPE* {
  Py_XDECREF(keep$argnum);
  free(mm$argnum);
}
%enddef

%define PKV_NO_SPECIAL {NULL} %enddef
PKV_OPTIONS_IN(pkv_pool_options, pkv_pool_options_init_sized, %arg({"hash_seed", "k_scales", "v_scales", NULL}), %arg(
  { const char* s = NULL;
    if (!pkv_py_dict_str($input, "hash_seed", keep, &s)) SWIG_fail;
    if (s) tmp.hash_seed = s;
    if (!pkv_py_dict_scales($input, keep, &tmp)) SWIG_fail; }))
PKV_OPTIONS_IN(pkv_seq_options, pkv_seq_options_init_sized, %arg({"cache_salt", "lora_name", "lora_path", "mm_items", "num_mm_items", NULL}), %arg(
  { if (!pkv_py_dict_str($input, "cache_salt", keep, &tmp.cache_salt)) SWIG_fail;
    if (!pkv_py_dict_str($input, "lora_name", keep, &tmp.lora_name)) SWIG_fail;
    if (!pkv_py_dict_str($input, "lora_path", keep, &tmp.lora_path)) SWIG_fail;
    if (!pkv_py_dict_mm($input, keep, &mm, &tmp.num_mm_items)) SWIG_fail;
    tmp.mm_items = mm; }))
PKV_OPTIONS_IN(pkv_hash_options, pkv_hash_options_init_sized, %arg({"seed", "cache_salt", "lora_name", "lora_path", "mm_items", "num_mm_items", NULL}), %arg(
  { const char* s = NULL;
    if (!pkv_py_dict_str($input, "seed", keep, &s)) SWIG_fail;
    if (s) tmp.seed = s;
    if (!pkv_py_dict_str($input, "cache_salt", keep, &tmp.cache_salt)) SWIG_fail;
    if (!pkv_py_dict_str($input, "lora_name", keep, &tmp.lora_name)) SWIG_fail;
    if (!pkv_py_dict_str($input, "lora_path", keep, &tmp.lora_path)) SWIG_fail;
    if (!pkv_py_dict_mm($input, keep, &mm, &tmp.num_mm_items)) SWIG_fail;
    tmp.mm_items = mm; }))
PKV_OPTIONS_IN(pkv_attention_params, pkv_attention_params_init_sized, PKV_NO_SPECIAL, )
PKV_OPTIONS_IN(pkv_event_publisher_options, pkv_event_publisher_options_init_sized, %arg({"topic", "device_medium", NULL}), %arg(
  { const char* s = NULL;
    if (!pkv_py_dict_str($input, "topic", keep, &s)) SWIG_fail;
    if (s) tmp.topic = s;
    if (!pkv_py_dict_str($input, "device_medium", keep, &tmp.device_medium)) SWIG_fail; }))
%immutable pkv_event_publisher_options::topic;
%immutable pkv_event_publisher_options::device_medium;
PKV_OPTIONS_IN(pkv_tier_options, pkv_tier_options_init_sized, %arg({"file_dir", NULL}), %arg(
  { if (!pkv_py_dict_str($input, "file_dir", keep, &tmp.file_dir)) SWIG_fail; }))
PKV_OPTIONS_IN(pkv_transfer_options, pkv_transfer_options_init_sized, %arg({"transports", NULL}), %arg(
  { if (!pkv_py_dict_str($input, "transports", keep, &tmp.transports)) SWIG_fail; }))
%immutable pkv_transfer_options::transports;

/* C string arguments: str without NUL characters (C reads up to the first,
 * so "a\0b" would silently be "a"); replay_endpoint may be None (NULL). */
%typemap(in) const char* seed { if (!pkv_py_c_str($input, "seed", 0, (const char**)&$1)) SWIG_fail; }
%typemap(in) const char* endpoint { if (!pkv_py_c_str($input, "endpoint", 0, (const char**)&$1)) SWIG_fail; }
%typemap(in) const char* replay_endpoint {
  if (!pkv_py_c_str($input, "replay_endpoint", 1, (const char**)&$1)) SWIG_fail;
}

/* Borrowed pointers in option structs can only be set through the dict
 * form above; proxies expose them read-only. */
%immutable pkv_pool_options::hash_seed;
%immutable pkv_tier_options::file_dir;
%immutable pkv_pool_options::k_scales;
%immutable pkv_pool_options::v_scales;
%immutable pkv_seq_options::cache_salt;
%immutable pkv_seq_options::lora_name;
%immutable pkv_seq_options::lora_path;
%immutable pkv_seq_options::mm_items;
%immutable pkv_seq_options::num_mm_items;
%immutable pkv_hash_options::seed;
%immutable pkv_hash_options::cache_salt;
%immutable pkv_hash_options::lora_name;
%immutable pkv_hash_options::lora_path;
%immutable pkv_hash_options::mm_items;
%immutable pkv_hash_options::num_mm_items;
%immutable pkv_mm_item::hash;

/* -------------------------------------------------- struct member arrays */

%typemap(out) uint8_t bytes[ANY] {
  $result = PyBytes_FromStringAndSize((const char*)$1, $1_dim0);
}
%typemap(out) pkv_block_hash* block_hash, pkv_block_hash* parent_hash {
  $result = PyBytes_FromStringAndSize((const char*)$1->bytes, PKV_HASH_MAX_BYTES);
}
%typemap(out) int64_t shape[ANY], int64_t strides[ANY] {
  $result = PyTuple_New($1_dim0);
  if (!$result) SWIG_fail;
  for (Py_ssize_t i = 0; i < $1_dim0; ++i) PyTuple_SET_ITEM($result, i, PyLong_FromLongLong($1[i]));
}
%typemap(in) int64_t shape[ANY] (int64_t tmp[PKV_TENSOR_MAX_DIMS]) {
  PyObject* seq = pkv_py_items($input, "$1_name: expected a sequence of ints");
  if (!seq) SWIG_fail;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > $1_dim0) {
    Py_DECREF(seq);
    PyErr_Format(PyExc_ValueError, "$1_name: at most %d entries", (int)$1_dim0);
    SWIG_fail;
  }
  for (Py_ssize_t i = 0; i < $1_dim0; ++i) {
    tmp[i] = 0;
    if (i < n && !pkv_py_i64_item(PySequence_Fast_GET_ITEM(seq, i), "$symname", "$1_name", i, &tmp[i])) {
      Py_DECREF(seq);
      SWIG_fail;
    }
  }
  Py_DECREF(seq);
  $1 = tmp;
}

%apply int64_t shape[ANY] { int64_t strides[ANY] };

/* ------------------------------------------------------------ the headers */

#define PKV_API
%include "pagedkv/common.h"
%include "pagedkv/hash.h"
%include "pagedkv/pool.h"
%include "pagedkv/batch.h"
%include "pagedkv/events.h"
%include "pagedkv/tiers.h"
%include "pagedkv/groups.h"

/* The descriptor of an export as bytes (the raw two-call form is hidden). */
%ignore pkv_transfer_export_descriptor;
%include "pagedkv/transfer.h"
%inline %{
PyObject* pkv_py_transfer_descriptor(pkv_transfer_engine* engine, uint64_t export_id) {
  uint64_t size = 0;
  pkv_status st = pkv_transfer_export_descriptor(engine, export_id, NULL, 0, &size);
  if (st != PKV_E_BUFFER_TOO_SMALL) {
    pkv_py_raise(st == PKV_OK ? PKV_E_INTERNAL : st);
    return NULL;
  }
  PyObject* b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
  if (!b) return NULL;
  st = pkv_transfer_export_descriptor(engine, export_id, (uint8_t*)PyBytes_AS_STRING(b), size, &size);
  if (st != PKV_OK) {
    Py_DECREF(b);
    pkv_py_raise(st);
    return NULL;
  }
  return b;
}
%}

/* ------------------------------------------------------------ exceptions */

%pythoncode %{
_Handle = _pagedkv_ext._Handle
_SeqBase = _pagedkv_ext._SeqBase
_adopt_export = _pagedkv_ext._adopt_export


class PagedKVError(Exception):
    """Base of every error raised by pagedkv.

    ``status`` is the ``PKV_E_*`` code the library returned and ``message``
    the library's own text naming what was wrong (``str(err)`` too).
    """

    status = PKV_E_INTERNAL

    def __init__(self, message="", status=None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status

    @property
    def status_name(self):
        """The code's name, e.g. ``"PKV_E_OUT_OF_BLOCKS"``."""
        return pkv_status_string(self.status).split(":", 1)[0]


class InvalidArgumentError(PagedKVError, ValueError):
    """PKV_E_INVALID_ARGUMENT: an argument is NULL, out of range or malformed."""

    status = PKV_E_INVALID_ARGUMENT


class NotFoundError(PagedKVError, LookupError):
    """PKV_E_NOT_FOUND: an unknown or stale sequence id, an unknown block."""

    status = PKV_E_NOT_FOUND


class OutOfBlocksError(PagedKVError):
    """PKV_E_OUT_OF_BLOCKS: not enough free KV blocks; nothing changed."""

    status = PKV_E_OUT_OF_BLOCKS


class OutOfMemoryError(PagedKVError, MemoryError):
    """PKV_E_OUT_OF_MEMORY: a host or device allocation failed."""

    status = PKV_E_OUT_OF_MEMORY


class UnsupportedError(PagedKVError, NotImplementedError):
    """PKV_E_UNSUPPORTED: a valid request this build or device cannot do."""

    status = PKV_E_UNSUPPORTED


class CudaError(PagedKVError, RuntimeError):
    """PKV_E_CUDA: a CUDA runtime call failed."""

    status = PKV_E_CUDA


class BufferTooSmallError(PagedKVError):
    """PKV_E_BUFFER_TOO_SMALL: an output buffer was too small."""

    status = PKV_E_BUFFER_TOO_SMALL


class InvalidStateError(PagedKVError, RuntimeError):
    """PKV_E_INVALID_STATE: the call is not valid now (stale plan, closed pool)."""

    status = PKV_E_INVALID_STATE


class InvariantError(PagedKVError, AssertionError):
    """PKV_E_INVARIANT: validate() found a broken invariant."""

    status = PKV_E_INVARIANT


class InternalError(PagedKVError, RuntimeError):
    """PKV_E_INTERNAL: a bug in pagedkv."""

    status = PKV_E_INTERNAL


ERROR_CLASSES = {
    cls.status: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        OutOfBlocksError,
        OutOfMemoryError,
        UnsupportedError,
        CudaError,
        BufferTooSmallError,
        InvalidStateError,
        InvariantError,
        InternalError,
    )
}
_pkv_register_error(0, PagedKVError)
for _code, _cls in ERROR_CLASSES.items():
    _pkv_register_error(_code, _cls)
del _code, _cls
%}
