/* The agent's four hottest hooks in C: what a training loop pays for tm on every iteration.
 *
 * Each hook here is a transliteration of one Python function of the agent, line for line, and names it:
 *
 *   DataNext      _phases.py, Phases.attach_data_wait's __next__ (the DataLoader's data wait)
 *   Forward       _forward.py, ModelForward.__call__, with _model.py's ModelProbe._pre_hook inside it
 *   Backward      _loss.py, _wrap_backward's backward (the loss passed to backward())
 *   StepPreHook   _iterations.py, IterationDetector.pre_hook's steady lane, with _agent.py's
 *                 Agent.send_steady_step and _outbox.py's Outbox.put inside it
 *
 * They read and write the same attributes of the same Python objects as the Python functions do, evaluate the same
 * conditions in the same order, and call back into the Python code for every branch that is not the steady one (a
 * first batch, a fault, a stopped probe, the general way of the optimizer hooks). The Python functions stay the
 * agent's definition and its fallback: _nativelane.py installs these only where this module was built, and puts the
 * Python ones back once torch.compile or dynamo starts (dynamo can trace Python, not this). The model's forward is
 * one that dynamo must be able to trace at any time (torch.export, a compiled function that calls the model): its
 * type's __call__ attribute is ModelForward.__call__ (trace_as), which dynamo inlines, while CPython calls the C one.
 *
 * Why: a Python function called at each of these points costs more than every probe's own work (do-nothing Python
 * hooks at the four points added 17k instructions an iteration to issue 16's tight loop, the same hooks in C 2.5k).
 *
 * Rules that keep it equal to the Python code:
 *  - every attribute named here is a plain instance attribute of its object or a plain class attribute (no
 *    property, no __slots__, no __getattr__ on those classes): it is read from the instance's __dict__ first and
 *    from the class otherwise, as Python's own lookup would find it;
 *  - an `except Exception` of the Python code is stop_probe() here: an Exception goes to the agent, anything else
 *    (KeyboardInterrupt) goes on to the caller; what the Python code does outside a try propagates here too;
 *  - the clock is CLOCK_MONOTONIC turned into seconds as CPython's time.monotonic() and time.perf_counter() turn it
 *    on Linux (the only platform this is built for), so times taken here and in Python compare;
 *  - no allocation happens between a check of the outbox and the append it allows (the flush timer thread can only
 *    take the GIL where Python code runs, and a collection triggered by an allocation could run some).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>
#include <time.h>

#ifndef TM_SOURCE_CRC
#define TM_SOURCE_CRC 0u /* built by hand: never matches, so the agent does not use it */
#endif

/* -- names and constants ------------------------------------------------------------------------------------------ */

#define NAMES(X)                                                                                                     \
    X(lean) X(activated) X(_faults) X(stopped) X(iterations) X(iteration) X(_step_owner) X(_last_emitted_step)      \
    X(outbox) X(_items) X(put) X(_agent_s) X(data_seen) X(_batch) X(_failed) X(append) X(window_s) X(max_records)   \
    X(_opened_t) X(losses) X(on) X(_is_compiling) X(check_fault) X(_profiler_on) X(profiled) X(training)            \
    X(_grad_enabled) X(seq_len_sent) X(micro_batches) X(flops) X(done) X(_tensor_type) X(dtype) X(_int_dtypes)      \
    X(is_meta) X(tokens) X(numel) X(tokens_source) X(_micro_batch) X(_depth) X(_scaled) X(_why) X(_calls) X(is_cpu) \
    X(dim) X(is_floating_point) X(item) X(_entries) X(backward_ran) X(tensors) X(pre_calls) X(_lane) X(steps_on)    \
    X(param_groups) X(params) X(grad) X(_marks) X(_version) X(_postless) X(_seen_grad) X(_seen_version)             \
    X(_iteration_start_t) X(counted) X(_send_fields) X(_general_pre) X(stop_probe) X(_pending_tokens) X(model)      \
    X(root_ref) X(tokens_missing) X(dp) X(_started_step) X(loss) X(_copies) X(_pending) X(_said) X(_labelled)       \
    X(end_step) X(_overhead_s) X(_overhead_steps) X(_overhead_fact) X(forward) X(deepcopy) X(get)

#define ENUMERATE(name) F_##name,
enum { NAMES(ENUMERATE) N_FIELDS };
#undef ENUMERATE
static PyObject *NAME[N_FIELDS]; /* interned */
/* String values the Python code compares with or stores (interned, as the Python literals are). */
static PyObject *S_data_wait, *S_dataloader, *S_emit, *S_hooks, *S_input_ids, *S_model, *S_loss, *S_steps;
static PyObject *ZERO, *ONE, *builtin_sum, *builtin_getattr, *copy_module;

/* -- the clock ---------------------------------------------------------------------------------------------------- */

/* time.monotonic() (and time.perf_counter(), the same clock on Linux), as CPython computes it: nanoseconds from
   CLOCK_MONOTONIC, then seconds as a double (_PyTime_AsSecondsDouble). */
static double monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    volatile double d;
    if (ns % 1000000000 == 0) {
        d = (double)(ns / 1000000000);
    } else {
        d = (double)ns;
        d /= 1e9;
    }
    return d;
}

/* -- the hooks' common part ------------------------------------------------------------------------------------------ */

/* Where one attribute lives in objects of one type: a __slots__ member at its offset, or anywhere else (found by the
   full lookup). Learnt per type and per version of the type (a type that changes has a new version tag). */
typedef struct {
    PyTypeObject *type; /* a strong reference; NULL until learnt */
    unsigned int version;
    Py_ssize_t offset; /* > 0: a writable __slots__ member at this offset; 0: PyObject_GetAttr / PyObject_SetAttr */
} Field;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;     /* its own attributes, as a function has them: __wrapped__, _tm_wrapped, __name__, ... */
    PyObject *weakrefs;
    PyObject *agent;
    PyObject *probe;    /* Phases, the ModelProbe, the LossProbe or the IterationDetector */
    PyObject *original; /* what it wraps: __next__, the class's forward, autograd.backward; NULL for the step hook */
    PyObject *module_ref; /* Forward: a weak reference to the model */
    PyObject *code;     /* DataNext: _outbox.PHASE; StepPreHook: _outbox.STEADY_STEP */
    PyObject *limit;    /* Backward: _loss.MAX_CALLS_PER_ITERATION */
    PyObject *attached; /* StepPreHook: _loss.ATTACHED */
    PyObject *origin;   /* StepPreHook: _loss.ORIGIN */
    PyObject *overhead_first, *overhead_every; /* StepPreHook: _agent.OVERHEAD_FIRST, OVERHEAD_EVERY */
    PyObject *floating_dtype; /* Backward: the last loss's dtype, and whether it is a floating-point one */
    int floating;
    Field fields[N_FIELDS];
} Hook;

/* -- attributes of the agent's objects -------------------------------------------------------------------------------- */

static Field *learn(Field *f, int id, PyTypeObject *type);

static inline Field *field(Hook *self, int id, PyTypeObject *type) {
    Field *f = &self->fields[id];
    if (f->type == type && f->version == type->tp_version_tag &&
        PyType_HasFeature(type, Py_TPFLAGS_VALID_VERSION_TAG))
        return f;
    return learn(f, id, type);
}

static Field *learn(Field *f, int id, PyTypeObject *type) {
    PyObject *descr = _PyType_Lookup(type, NAME[id]); /* borrowed; it also gives the type a valid version tag */
    Py_ssize_t offset = 0;
    if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type == T_OBJECT_EX && !(member->flags & READONLY)) offset = member->offset;
    }
    Py_INCREF(type);
    Py_XSETREF(f->type, type);
    f->version = type->tp_version_tag;
    f->offset = PyType_HasFeature(type, Py_TPFLAGS_VALID_VERSION_TAG) ? offset : 0;
    return f;
}

/* obj.<NAME[id]>, a new reference (NULL with the exception Python would raise). */
static inline PyObject *get(Hook *self, int id, PyObject *obj) {
    Field *f = field(self, id, Py_TYPE(obj));
    if (f->offset > 0) {
        PyObject *value = *(PyObject **)((char *)obj + f->offset);
        if (value != NULL) return Py_NewRef(value);
    }
    return PyObject_GetAttr(obj, NAME[id]);
}

/* obj.<NAME[id]> for an object of any class (nn.Module's `training`): where its class has no attribute of that name
   (no descriptor, no class value), Python's lookup ends at the instance's __dict__, read here directly; a class
   with a __getattr__ (nn.Module's) is only asked once that fails, as Python asks it. */
static PyObject *instance_attribute(Hook *self, int id, PyObject *obj) {
    Field *f = field(self, id, Py_TYPE(obj));
    if (f->offset == 0 && f->type != NULL && _PyType_Lookup(f->type, NAME[id]) == NULL) {
        PyObject **dict = _PyObject_GetDictPtr(obj);
        PyObject *value = dict != NULL && *dict != NULL ? PyDict_GetItemWithError(*dict, NAME[id]) : NULL;
        if (value != NULL) return Py_NewRef(value);
        if (PyErr_Occurred()) return NULL;
    }
    return PyObject_GetAttr(obj, NAME[id]);
}

/* obj.<NAME[id]> = value (a new reference, taken); -1 on failure. */
static inline int set(Hook *self, int id, PyObject *obj, PyObject *value) {
    if (value == NULL) return -1;
    Field *f = field(self, id, Py_TYPE(obj));
    if (f->offset > 0) {
        PyObject **where = (PyObject **)((char *)obj + f->offset);
        PyObject *old = *where;
        *where = value;
        Py_XDECREF(old);
        return 0;
    }
    int result = PyObject_SetAttr(obj, NAME[id], value);
    Py_DECREF(value);
    return result;
}

/* Truth of obj.<name>: 1, 0, or -1 on failure. */
static inline int get_true(Hook *self, int id, PyObject *obj) {
    PyObject *value = get(self, id, obj);
    if (value == NULL) return -1;
    int result = PyObject_IsTrue(value);
    Py_DECREF(value);
    return result;
}

/* obj.<name> is None: 1, 0, or -1. */
static inline int get_none(Hook *self, int id, PyObject *obj) {
    PyObject *value = get(self, id, obj);
    if (value == NULL) return -1;
    int result = value == Py_None;
    Py_DECREF(value);
    return result;
}

/* obj.<name>() is true: 1, 0, or -1. */
static int call_true(Hook *self, int id, PyObject *obj) {
    PyObject *function = get(self, id, obj);
    if (function == NULL) return -1;
    PyObject *value = PyObject_CallNoArgs(function);
    Py_DECREF(function);
    if (value == NULL) return -1;
    int result = PyObject_IsTrue(value);
    Py_DECREF(value);
    return result;
}

/* obj.<name> += amount (a new reference, taken). */
static int add(Hook *self, int id, PyObject *obj, PyObject *amount) {
    if (amount == NULL) return -1;
    PyObject *value = get(self, id, obj);
    if (value == NULL) {
        Py_DECREF(amount);
        return -1;
    }
    PyObject *sum = PyNumber_Add(value, amount);
    Py_DECREF(value);
    Py_DECREF(amount);
    return set(self, id, obj, sum);
}

/* obj.<name> += seconds, for the float attributes that time the agent (``_agent_s += perf_counter() - started``). */
static int add_seconds(Hook *self, int id, PyObject *obj, double seconds) {
    PyObject *value = get(self, id, obj);
    if (value == NULL) return -1;
    PyObject *sum;
    if (PyFloat_CheckExact(value)) {
        sum = PyFloat_FromDouble(PyFloat_AS_DOUBLE(value) + seconds);
    } else {
        PyObject *amount = PyFloat_FromDouble(seconds);
        sum = amount != NULL ? PyNumber_Add(value, amount) : NULL;
        Py_XDECREF(amount);
    }
    Py_DECREF(value);
    return set(self, id, obj, sum);
}

/* obj.name(*args), a new reference. */
static PyObject *call_method(PyObject *obj, PyObject *name, PyObject *const *args, size_t nargs) {
    PyObject *stack[8];
    stack[0] = obj;
    for (size_t i = 0; i < nargs && i < 7; i++) stack[i + 1] = args[i];
    return PyObject_VectorcallMethod(name, stack, (nargs + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static int hook_traverse(Hook *self, visitproc visit, void *arg) {
    Py_VISIT(self->dict);
    Py_VISIT(self->agent);
    Py_VISIT(self->probe);
    Py_VISIT(self->original);
    Py_VISIT(self->module_ref);
    Py_VISIT(self->code);
    Py_VISIT(self->limit);
    Py_VISIT(self->attached);
    Py_VISIT(self->origin);
    Py_VISIT(self->overhead_first);
    Py_VISIT(self->overhead_every);
    Py_VISIT(self->floating_dtype);
    for (int i = 0; i < N_FIELDS; i++) Py_VISIT(self->fields[i].type);
    return 0;
}

static int hook_clear(Hook *self) {
    Py_CLEAR(self->dict);
    Py_CLEAR(self->agent);
    Py_CLEAR(self->probe);
    Py_CLEAR(self->original);
    Py_CLEAR(self->module_ref);
    Py_CLEAR(self->code);
    Py_CLEAR(self->limit);
    Py_CLEAR(self->attached);
    Py_CLEAR(self->origin);
    Py_CLEAR(self->overhead_first);
    Py_CLEAR(self->overhead_every);
    Py_CLEAR(self->floating_dtype);
    for (int i = 0; i < N_FIELDS; i++) Py_CLEAR(self->fields[i].type);
    return 0;
}

static void hook_dealloc(Hook *self) {
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL) PyObject_ClearWeakRefs((PyObject *)self);
    hook_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Hook *hook_alloc(PyTypeObject *type, vectorcallfunc vectorcall, PyObject *agent, PyObject *probe) {
    Hook *self = (Hook *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = vectorcall;
    self->agent = Py_NewRef(agent);
    self->probe = Py_NewRef(probe);
    return self;
}

static PyObject *hook_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    return PyVectorcall_Call(self, args, kwargs);
}

/* The Python code's `except Exception as exc: <owner>.<method>(<probe>, exc)`: an Exception is handed over (0), any
   other exception stays raised (-1), as it would leave an `except Exception`. */
static int handle(PyObject *owner, PyObject *method, PyObject *probe) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL && value != NULL) PyException_SetTraceback(value, traceback);
    PyObject *args[2] = {probe, value != NULL ? value : Py_None};
    PyObject *result = call_method(owner, method, args, 2);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    if (result == NULL) return -1;
    Py_DECREF(result);
    return 0;
}

static int stop_probe(Hook *self, PyObject *probe) { return handle(self->agent, NAME[F_stop_probe], probe); }

/* `"<name>" in agent.stopped`: 1, 0, or -1. */
static int stopped(Hook *self, PyObject *name) {
    PyObject *set_ = get(self, F_stopped, self->agent);
    if (set_ == NULL) return -1;
    int result = PySequence_Contains(set_, name);
    Py_DECREF(set_);
    return result;
}

/* agent.iterations, a new reference. */
static PyObject *iterations_of(Hook *self) { return get(self, F_iterations, self->agent); }

/* agent.iterations._agent_s += monotonic() - since */
static int add_agent_time(Hook *self, double since) {
    PyObject *iterations = iterations_of(self);
    if (iterations == NULL) return -1;
    int result = add_seconds(self, F__agent_s, iterations, monotonic_s() - since);
    Py_DECREF(iterations);
    return result;
}

/* -- DataNext: _phases.py, the data wait of a DataLoader batch -------------------------------------------------------- */

/* The try block of the steady batch: its phase tuple into the open window (or through Outbox.put). */
static int data_wait(Hook *self, double started) {
    PyObject *agent = self->agent;
    double ended = monotonic_s();
    PyObject *step, *owner = get(self, F__step_owner, agent);
    if (owner == NULL) return -1;
    int emit = PyObject_RichCompareBool(owner, S_emit, Py_EQ);
    Py_DECREF(owner);
    if (emit < 0) return -1;
    if (emit) {
        step = get(self, F__last_emitted_step, agent);
    } else {
        PyObject *iterations = iterations_of(self);
        if (iterations == NULL) return -1;
        step = get(self, F_iteration, iterations);
        Py_DECREF(iterations);
        if (step != NULL) {
            int counted = PyObject_IsTrue(step);
            if (counted < 0) Py_CLEAR(step);
            else if (!counted) Py_SETREF(step, Py_NewRef(Py_None));
        }
    }
    if (step == NULL) return -1;
    PyObject *item = PyTuple_New(6);
    if (item == NULL) {
        Py_DECREF(step);
        return -1;
    }
    PyTuple_SET_ITEM(item, 0, Py_NewRef(self->code));
    PyTuple_SET_ITEM(item, 1, Py_NewRef(S_data_wait));
    PyTuple_SET_ITEM(item, 2, PyFloat_FromDouble(started));
    PyObject *ended_f = PyFloat_FromDouble(ended);
    PyTuple_SET_ITEM(item, 3, Py_XNewRef(ended_f));
    PyTuple_SET_ITEM(item, 4, step);
    PyTuple_SET_ITEM(item, 5, Py_NewRef(S_dataloader));
    int result = -1;
    PyObject *outbox = NULL, *items = NULL, *done = NULL;
    if (PyTuple_GET_ITEM(item, 2) == NULL || ended_f == NULL) goto finally;
    outbox = get(self, F_outbox, agent);
    if (outbox == NULL) goto finally;
    items = get(self, F__items, outbox);
    if (items == NULL) goto finally;
    int open = PyObject_IsTrue(items); /* the window is open: the step that follows checks its deadline */
    if (open < 0) goto finally;
    if (open) {
        done = call_method(items, NAME[F_append], &item, 1);
    } else {
        PyObject *args[2] = {item, ended_f};
        done = call_method(outbox, NAME[F_put], args, 2);
    }
    if (done == NULL) goto finally;
    result = add_agent_time(self, ended);
finally:
    Py_XDECREF(done);
    Py_XDECREF(items);
    Py_XDECREF(outbox);
    Py_XDECREF(ended_f);
    Py_DECREF(item);
    return result;
}

static PyObject *next_vectorcall(Hook *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "__next__() takes exactly one argument (the iterator)");
        return NULL;
    }
    PyObject *agent = self->agent, *phases = self->probe;
    double started = monotonic_s();
    PyObject *batch = PyObject_Vectorcall(self->original, args, 1, NULL);
    if (batch == NULL) return NULL;
    int steady = get_true(self, F_lean, agent);
    if (steady > 0) steady = get_true(self, F_data_seen, phases);
    if (steady > 0) steady = get_true(self, F_activated, agent);
    if (steady > 0) {
        int faults = get_true(self, F__faults, agent);
        steady = faults < 0 ? -1 : !faults;
    }
    if (steady > 0) {
        int out = stopped(self, S_data_wait);
        steady = out < 0 ? -1 : !out;
    }
    if (steady > 0) {
        int mapping = PyList_CheckExact(batch) || PyTuple_CheckExact(batch)
                          ? 0
                          : PyObject_IsInstance(batch, (PyObject *)&PyDict_Type);
        steady = mapping < 0 ? -1 : !mapping;
    }
    if (steady < 0) goto error;
    if (steady) {
        if (data_wait(self, started) < 0 && handle(phases, NAME[F__failed], S_data_wait) < 0) goto error;
        return batch;
    }
    int out = stopped(self, S_data_wait);
    if (out < 0) goto error;
    if (!out) {
        PyObject *started_f = PyFloat_FromDouble(started);
        if (started_f == NULL) goto error;
        PyObject *call_args[2] = {started_f, batch};
        PyObject *done = call_method(phases, NAME[F__batch], call_args, 2);
        Py_DECREF(started_f);
        if (done == NULL) goto error;
        Py_DECREF(done);
    }
    return batch;
error:
    Py_DECREF(batch);
    return NULL;
}

/* As a function in the class's dict: bound to the iterator it is read from, itself when read from the class. */
static PyObject *next_descr_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyObject *next_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *original, *agent, *phases, *code;
    static char *keywords[] = {"original", "agent", "phases", "code", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO:DataNext", keywords, &original, &agent, &phases, &code))
        return NULL;
    Hook *self = hook_alloc(type, (vectorcallfunc)next_vectorcall, agent, phases);
    if (self == NULL) return NULL;
    self->original = Py_NewRef(original);
    self->code = Py_NewRef(code);
    return (PyObject *)self;
}

/* -- Forward: _forward.py's ModelForward, with the model probe's _pre_hook ----------------------------------------- */

/* A forward's positional arguments as a tuple and its keywords as a dict, for the Python code's cold branches. */
static PyObject *as_tuple(PyObject *const *args, Py_ssize_t nargs) {
    PyObject *tuple = PyTuple_New(nargs);
    if (tuple == NULL) return NULL;
    for (Py_ssize_t i = 0; i < nargs; i++) PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    return tuple;
}

static PyObject *as_dict(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *dict = PyDict_New();
    if (dict == NULL || kwnames == NULL) return dict;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
        if (PyDict_SetItem(dict, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
            Py_DECREF(dict);
            return NULL;
        }
    }
    return dict;
}

/* self._micro_batch(args, kwargs) */
static int micro_batch(Hook *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *tuple = as_tuple(args, nargs);
    PyObject *dict = tuple != NULL ? as_dict(args, nargs, kwnames) : NULL;
    PyObject *done = NULL;
    if (dict != NULL) {
        PyObject *call_args[2] = {tuple, dict};
        done = call_method(self->probe, NAME[F__micro_batch], call_args, 2);
    }
    Py_XDECREF(tuple);
    Py_XDECREF(dict);
    if (done == NULL) return -1;
    Py_DECREF(done);
    return 0;
}

/* The try block of ModelProbe._pre_hook. */
static int forward_probe(Hook *self, PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *agent = self->agent, *probe = self->probe;
    int faults = get_true(self, F__faults, agent);
    if (faults < 0) return -1;
    if (faults) {
        PyObject *done = call_method(agent, NAME[F_check_fault], &S_model, 1);
        if (done == NULL) return -1;
        Py_DECREF(done);
    }
    int profiling = call_true(self, F__profiler_on, probe);
    if (profiling < 0) return -1;
    if (profiling && set(self, F_profiled, probe, Py_NewRef(Py_True)) < 0) return -1;
    PyObject *training_v = instance_attribute(self, F_training, module);
    if (training_v == NULL) return -1;
    int training = PyObject_IsTrue(training_v);
    Py_DECREF(training_v);
    if (training <= 0) return training;
    int grad = call_true(self, F__grad_enabled, probe);
    if (grad <= 0) return grad;
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    int common = nargs > 0 && nkw == 0;
    if (common) common = get_true(self, F_seq_len_sent, probe);
    if (common > 0) {
        common = get_true(self, F_micro_batches, probe);
        if (common == 0) {
            PyObject *flops = get(self, F_flops, agent);
            if (flops == NULL) return -1;
            common = get_true(self, F_done, flops);
            Py_DECREF(flops);
        }
    }
    if (common < 0) return -1;
    if (!common) return micro_batch(self, args, nargs, kwnames);
    /* The common forward(ids), counted as _micro_batch counts it: every position is a token. */
    PyObject *ids = args[0];
    PyObject *tensor_type = get(self, F__tensor_type, probe);
    if (tensor_type == NULL) return -1;
    int ok = PyObject_IsInstance(ids, tensor_type);
    Py_DECREF(tensor_type);
    if (ok > 0) {
        PyObject *dtype = PyObject_GetAttr(ids, NAME[F_dtype]);
        PyObject *ints = dtype != NULL ? get(self, F__int_dtypes, probe) : NULL;
        ok = ints != NULL ? PySequence_Contains(ints, dtype) : -1;
        Py_XDECREF(dtype);
        Py_XDECREF(ints);
    }
    if (ok > 0) {
        PyObject *meta_v = PyObject_GetAttr(ids, NAME[F_is_meta]);
        if (meta_v == NULL) return -1;
        int meta = PyObject_IsTrue(meta_v);
        Py_DECREF(meta_v);
        ok = meta < 0 ? -1 : !meta;
    }
    if (ok < 0) return -1;
    if (!ok) return micro_batch(self, args, nargs, kwnames);
    if (add(self, F_micro_batches, probe, Py_NewRef(ONE)) < 0) return -1;
    if (add(self, F_tokens, probe, call_method(ids, NAME[F_numel], NULL, 0)) < 0) return -1;
    return set(self, F_tokens_source, probe, Py_NewRef(S_input_ids));
}

/* ModelProbe._pre_hook(module, args, kwargs): 0, or -1 where the Python code would raise into the forward. */
static int forward_pre_hook(Hook *self, PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames) {
    int on = get_true(self, F_on, self->probe);
    if (on <= 0) return on;
    int compiling = call_true(self, F__is_compiling, self->probe);
    if (compiling != 0) return compiling < 0 ? -1 : 0;
    double started = monotonic_s();
    if (forward_probe(self, module, args, nargs, kwnames) < 0 && stop_probe(self, S_model) < 0) return -1;
    return add_agent_time(self, started);
}

static PyObject *forward_vectorcall(Hook *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t total = nargs + (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *module = PyObject_CallNoArgs(self->module_ref);
    if (module == NULL) return NULL;
    if (forward_pre_hook(self, module, args, nargs, kwnames) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    /* self.function(module, *args, **kwargs) */
    PyObject *small[9], **stack = small;
    if (total + 1 > 9) {
        stack = PyMem_Malloc((total + 1) * sizeof(PyObject *));
        if (stack == NULL) {
            Py_DECREF(module);
            return PyErr_NoMemory();
        }
    }
    stack[0] = module;
    for (Py_ssize_t i = 0; i < total; i++) stack[i + 1] = args[i];
    PyObject *result = PyObject_Vectorcall(self->original, stack, nargs + 1, kwnames);
    if (stack != small) PyMem_Free(stack);
    Py_DECREF(module);
    return result;
}

static PyObject *forward_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *probe, *module, *function, *agent;
    static char *keywords[] = {"probe", "module", "function", "agent", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO:Forward", keywords, &probe, &module, &function, &agent))
        return NULL;
    PyObject *module_ref = PyWeakref_NewRef(module, NULL); /* the model owns this object: no cycle */
    if (module_ref == NULL) return NULL;
    Hook *self = hook_alloc(type, (vectorcallfunc)forward_vectorcall, agent, probe);
    if (self == NULL) {
        Py_DECREF(module_ref);
        return NULL;
    }
    self->module_ref = module_ref;
    self->original = Py_NewRef(function);
    return (PyObject *)self;
}

/* It reads as the bound method it stands for, as ModelForward does. */
static PyObject *forward_self(Hook *self, void *closure) { return PyObject_CallNoArgs(self->module_ref); }

static PyObject *forward_func(Hook *self, void *closure) { return Py_NewRef(self->original); }

static PyObject *forward_wrapped(Hook *self, void *closure) {
    PyObject *module = PyObject_CallNoArgs(self->module_ref);
    if (module == NULL) return NULL;
    PyObject *method = PyMethod_New(self->original, module);
    Py_DECREF(module);
    return method;
}

static PyObject *forward_deepcopy(Hook *self, PyObject *memo) {
    /* As ModelForward.__deepcopy__: the copy's forward is its class's, bound to the copy. */
    PyObject *method = forward_wrapped(self, NULL);
    if (method == NULL) return NULL;
    PyObject *args[2] = {method, memo};
    PyObject *copied = call_method(copy_module, NAME[F_deepcopy], args, 2);
    Py_DECREF(method);
    return copied;
}

/* Any other attribute as the bound method reads it, from its function (ModelForward.__getattr__): generic lookup
   first, then the bound method's. */
static PyObject *forward_getattro(Hook *self, PyObject *name) {
    PyObject *value = PyObject_GenericGetAttr((PyObject *)self, name);
    if (value != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)) return value;
    PyErr_Clear();
    PyObject *method = forward_wrapped(self, NULL);
    if (method == NULL) return NULL;
    value = PyObject_GetAttr(method, name);
    Py_DECREF(method);
    return value;
}

static PyObject *forward_reduce(Hook *self, PyObject *unused) {
    /* As ModelForward.__reduce__: the loaded model's forward is its class's. */
    PyObject *module = PyObject_CallNoArgs(self->module_ref);
    if (module == NULL) return NULL;
    PyObject *result = Py_BuildValue("(O(OO))", builtin_getattr, module, NAME[F_forward]);
    Py_DECREF(module);
    return result;
}

/* -- Backward: _loss.py's wrapper of torch.autograd.backward -------------------------------------------------------- */

/* probe._depth += step */
static int depth(Hook *self, long step) {
    return add(self, F__depth, self->probe, PyLong_FromLong(step));
}

/* The try block of the wrapper: 1 when the common CPU loss was read, 0 for backward_ran, -1 on failure. */
static int read_loss(Hook *self, PyObject *tensors, double started) {
    PyObject *agent = self->agent, *probe = self->probe;
    PyObject *tensor_type = get(self, F__tensor_type, probe);
    if (tensor_type == NULL) return -1;
    int common = (PyObject *)Py_TYPE(tensors) == tensor_type;
    Py_DECREF(tensor_type);
    if (common) {
        int faults = get_true(self, F__faults, agent);
        common = faults < 0 ? -1 : !faults;
    }
    if (common > 0) common = get_none(self, F__scaled, probe);
    if (common > 0) common = get_none(self, F__why, probe);
    if (common > 0) {
        PyObject *calls = get(self, F__calls, probe);
        if (calls == NULL) return -1;
        common = PyObject_RichCompareBool(calls, self->limit, Py_LT);
        Py_DECREF(calls);
    }
    if (common > 0) {
        PyObject *owner = get(self, F__step_owner, agent);
        if (owner == NULL) return -1;
        common = PyObject_RichCompareBool(owner, S_emit, Py_NE);
        Py_DECREF(owner);
    }
    if (common > 0) {
        int compiling = call_true(self, F__is_compiling, probe);
        common = compiling < 0 ? -1 : !compiling;
    }
    if (common > 0) {
        PyObject *cpu = PyObject_GetAttr(tensors, NAME[F_is_cpu]);
        if (cpu == NULL) return -1;
        common = PyObject_IsTrue(cpu);
        Py_DECREF(cpu);
    }
    if (common > 0) {
        PyObject *dims = call_method(tensors, NAME[F_dim], NULL, 0);
        if (dims == NULL) return -1;
        common = PyObject_RichCompareBool(dims, ZERO, Py_EQ);
        Py_DECREF(dims);
    }
    if (common > 0) {
        /* tensors.is_floating_point(): of an exact torch.Tensor, its dtype's is_floating_point (both are
           at::isFloatingType of the same scalar type), remembered for the last dtype object (dtypes are singletons):
           one getter instead of a method call. */
        PyObject *dtype = PyObject_GetAttr(tensors, NAME[F_dtype]);
        if (dtype == NULL) return -1;
        if (dtype != self->floating_dtype) {
            PyObject *floating = PyObject_GetAttr(dtype, NAME[F_is_floating_point]);
            int is = floating != NULL ? PyObject_IsTrue(floating) : -1;
            Py_XDECREF(floating);
            if (is < 0) {
                Py_DECREF(dtype);
                return -1;
            }
            Py_XSETREF(self->floating_dtype, Py_NewRef(dtype));
            self->floating = is;
        }
        Py_DECREF(dtype);
        common = self->floating;
    }
    if (common <= 0) return common;
    /* The common case, in place: a 0-dim CPU loss with no scaler, read as backward_ran reads it. */
    PyObject *entries = get(self, F__entries, probe);
    if (entries == NULL) return -1;
    PyObject *value = call_method(tensors, NAME[F_item], NULL, 0);
    PyObject *done = value != NULL ? call_method(entries, NAME[F_append], &value, 1) : NULL;
    Py_XDECREF(value);
    Py_DECREF(entries);
    if (done == NULL) return -1;
    Py_DECREF(done);
    if (add(self, F__calls, probe, Py_NewRef(ONE)) < 0) return -1;
    if (add_agent_time(self, started) < 0) return -1;
    return 1;
}

static PyObject *backward_vectorcall(Hook *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (depth(self, 1) < 0) return NULL;
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    /* finally: probe._depth -= 1 (an exception it raises replaces the call's, as a finally's would) */
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (depth(self, -1) < 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        Py_XDECREF(result);
        return NULL;
    }
    PyErr_Restore(type, value, traceback);
    if (result == NULL) return NULL;
    int on = get_true(self, F_on, self->probe);
    if (on > 0) {
        int nested = get_true(self, F__depth, self->probe);
        on = nested < 0 ? -1 : !nested;
    }
    if (on < 0) goto error;
    if (!on) return result;
    PyObject *tensors = Py_None; /* args[0] if args else kwargs.get("tensors") */
    if (nargs > 0) {
        tensors = args[0];
    } else if (kwnames != NULL) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            int match = PyObject_RichCompareBool(PyTuple_GET_ITEM(kwnames, i), NAME[F_tensors], Py_EQ);
            if (match < 0) goto error;
            if (match) {
                tensors = args[i];
                break;
            }
        }
    }
    double started = monotonic_s();
    int read = read_loss(self, tensors, started);
    if (read < 0) {
        if (stop_probe(self, S_loss) < 0) goto error;
        return result;
    }
    if (read) return result;
    PyObject *done = call_method(self->probe, NAME[F_backward_ran], &tensors, 1);
    if (done == NULL) goto error;
    Py_DECREF(done);
    return result;
error:
    Py_DECREF(result);
    return NULL;
}

static PyObject *backward_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *original, *probe, *agent, *limit;
    static char *keywords[] = {"original", "probe", "agent", "limit", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO:Backward", keywords, &original, &probe, &agent, &limit))
        return NULL;
    Hook *self = hook_alloc(type, (vectorcallfunc)backward_vectorcall, agent, probe);
    if (self == NULL) return NULL;
    self->original = Py_NewRef(original);
    self->limit = Py_NewRef(limit);
    return (PyObject *)self;
}

/* -- StepPreHook: _iterations.py's steady lane, _agent.py's send_steady_step, _outbox.py's put ------------------------ */

/* Outbox.put(item, now) where the window is open and not due: the append alone; anything else through put. */
static int outbox_put(Hook *self, PyObject *outbox, PyObject *item, PyObject *now_f) {
    PyObject *items = get(self, F__items, outbox);
    if (items == NULL) return -1;
    PyObject *opened = NULL, *window = NULL, *most = NULL, *done = NULL;
    Py_ssize_t n = PyObject_Size(items);
    if (n < 0) goto finally;
    if (n >= 1) {
        opened = get(self, F__opened_t, outbox);
        window = opened != NULL ? get(self, F_window_s, outbox) : NULL;
        most = window != NULL ? get(self, F_max_records, outbox) : NULL;
        if (most == NULL) goto finally;
        if (PyFloat_CheckExact(opened) && PyFloat_CheckExact(window) && PyLong_CheckExact(most)) {
            long long limit = PyLong_AsLongLong(most);
            if (limit == -1 && PyErr_Occurred()) goto finally;
            double now = PyFloat_AS_DOUBLE(now_f);
            if (!(now - PyFloat_AS_DOUBLE(opened) >= PyFloat_AS_DOUBLE(window)) && (long long)n + 1 < limit) {
                done = call_method(items, NAME[F_append], &item, 1);
                goto finally;
            }
        }
    }
    PyObject *args[2] = {item, now_f};
    done = call_method(outbox, NAME[F_put], args, 2);
finally:
    Py_XDECREF(opened);
    Py_XDECREF(window);
    Py_XDECREF(most);
    Py_DECREF(items);
    if (done == NULL) return -1;
    Py_DECREF(done);
    return 0;
}

/* The gate of send_steady_step (inside its try): 1 when the iteration is steady, 0 when not, -1 on failure. */
static int steady_gate(Hook *self, PyObject *model, PyObject *flops) {
    PyObject *agent = self->agent;
    int v = get_true(self, F_lean, agent);
    if (v <= 0) return v;
    PyObject *owner = get(self, F__step_owner, agent);
    if (owner == NULL) return -1;
    v = PyObject_RichCompareBool(owner, S_hooks, Py_NE);
    Py_DECREF(owner);
    if (v != 0) return v < 0 ? -1 : 0;
    if ((v = get_none(self, F__pending_tokens, agent)) <= 0) return v;
    if (model == Py_None) return 0;
    if ((v = stopped(self, S_model)) != 0) return v < 0 ? -1 : 0;
    v = get_true(self, F_done, flops);
    if (v == 0) v = get_none(self, F__started_step, flops);
    if (v <= 0) return v;
    if ((v = get_none(self, F_root_ref, model)) != 0) return v < 0 ? -1 : 0;
    if ((v = get_true(self, F_micro_batches, model)) <= 0) return v;
    if ((v = get_true(self, F_tokens_missing, model)) != 0) return v < 0 ? -1 : 0;
    if ((v = get_none(self, F_dp, model)) != 0) return v < 0 ? -1 : 0;
    if ((v = get_true(self, F_profiled, model)) != 0) return v < 0 ? -1 : 0;
    if ((v = call_true(self, F__profiler_on, model)) != 0) return v < 0 ? -1 : 0;
    return 1;
}

/* The try block of send_steady_step around the loss: *loss_value and *loss_t set where the loss leaves with the
   step (new references), as far as it got before a failure. */
static int steady_loss(Hook *self, PyObject *loss, PyObject *outbox, PyObject *step, PyObject *micro_batches,
                       PyObject **loss_value, PyObject **loss_t) {
    PyObject *calls = get(self, F__calls, loss);
    if (calls == NULL) return -1;
    int v = PyObject_RichCompareBool(calls, micro_batches, Py_EQ);
    Py_DECREF(calls);
    if (v > 0) v = get_none(self, F__why, loss);
    if (v > 0) {
        int copies = get_true(self, F__copies, loss);
        v = copies < 0 ? -1 : !copies;
    }
    if (v > 0) {
        int pending = get_true(self, F__pending, loss);
        v = pending < 0 ? -1 : !pending;
    }
    if (v > 0) {
        PyObject *said = get(self, F__said, loss);
        if (said == NULL) return -1;
        v = said == self->attached;
        Py_DECREF(said);
    }
    if (v > 0) {
        PyObject *labelled = get(self, F__labelled, loss);
        if (labelled == NULL) return -1;
        v = PyObject_RichCompareBool(labelled, micro_batches, Py_EQ);
        Py_DECREF(labelled);
    }
    if (v < 0) return -1;
    if (!v) {
        PyObject *args[2] = {step, micro_batches};
        PyObject *done = call_method(loss, NAME[F_end_step], args, 2); /* queues its own metric, before the step */
        if (done == NULL) return -1;
        Py_DECREF(done);
        return 0;
    }
    /* One CPU value per micro-batch, nothing pending, its label and state already said: the loss leaves with the
       step (LossProbe.end_step would send it at once). */
    PyObject *entries = get(self, F__entries, loss);
    if (entries == NULL) return -1;
    if (PyList_CheckExact(entries) && PyList_GET_SIZE(entries) == 1 && PyFloat_CheckExact(PyList_GET_ITEM(entries, 0))) {
        /* sum([x]): builtin sum adds its start, the int 0, to x: 0.0 + x (so -0.0 gives 0.0, as it does there) */
        *loss_value = PyFloat_FromDouble(0.0 + PyFloat_AS_DOUBLE(PyList_GET_ITEM(entries, 0)));
    } else {
        *loss_value = PyObject_CallOneArg(builtin_sum, entries);
    }
    Py_DECREF(entries);
    if (*loss_value == NULL) return -1;
    if (set(self, F__calls, loss, Py_NewRef(ZERO)) < 0) return -1;
    if (set(self, F__entries, loss, PyList_New(0)) < 0) return -1;
    *loss_t = PyFloat_FromDouble(monotonic_s());
    if (*loss_t == NULL) return -1;
    return add(self, F_losses, outbox, Py_NewRef(ONE)); /* this step's item stands for two */
}

/* Agent.send_steady_step(step, t, step_time_s, optimizers, agent_us): 1 sent, 0 not steady (the caller sends the
   general way), -1 on a failure the Python code would raise. */
static int steady_step(Hook *self, PyObject *step, PyObject *t, PyObject *step_time_s, PyObject *optimizers,
                       PyObject *agent_us) {
    PyObject *agent = self->agent;
    int result = -1;
    PyObject *model = get(self, F_model, agent);
    PyObject *flops = model != NULL ? get(self, F_flops, agent) : NULL;
    PyObject *micro_batches = NULL, *tokens = NULL, *tokens_source = NULL, *loss = NULL, *outbox = NULL;
    PyObject *loss_value = NULL, *loss_t = NULL, *dp = NULL, *item = NULL;
    if (flops == NULL) goto finally;
    int steady = steady_gate(self, model, flops);
    if (steady < 0) {
        result = stop_probe(self, S_model) < 0 ? -1 : 0;
        goto finally;
    }
    if (!steady) {
        result = 0;
        goto finally;
    }
    if ((micro_batches = get(self, F_micro_batches, model)) == NULL) goto finally;
    if ((tokens = get(self, F_tokens, model)) == NULL) goto finally;
    if ((tokens_source = get(self, F_tokens_source, model)) == NULL) goto finally;
    if (set(self, F_micro_batches, model, Py_NewRef(ZERO)) < 0) goto finally;
    if (set(self, F_tokens, model, Py_NewRef(ZERO)) < 0) goto finally;
    if (set(self, F_tokens_source, model, Py_NewRef(Py_None)) < 0) goto finally;
    if ((loss = get(self, F_loss, agent)) == NULL) goto finally;
    if ((outbox = get(self, F_outbox, agent)) == NULL) goto finally;
    if (loss != Py_None) {
        int on = get_true(self, F_on, loss);
        if (on < 0) goto finally;
        if (on && steady_loss(self, loss, outbox, step, micro_batches, &loss_value, &loss_t) < 0 &&
            stop_probe(self, S_loss) < 0)
            goto finally;
    }
    if ((dp = get(self, F_dp, model)) == NULL) goto finally;
    /* One tuple for the metric and the step record: the hub builds both (trainmeter_core.model.window). */
    item = PyTuple_Pack(13, self->code, step, t, step_time_s, optimizers, agent_us, micro_batches, tokens,
                        tokens_source, dp, loss_value != NULL ? loss_value : Py_None,
                        loss_t != NULL ? loss_t : Py_None, self->origin);
    if (item == NULL) goto finally;
    if (outbox_put(self, outbox, item, t) < 0) goto finally;
    if (add(self, F__overhead_s, agent, Py_NewRef(agent_us)) < 0) goto finally;
    if (add(self, F__overhead_steps, agent, Py_NewRef(ONE)) < 0) goto finally;
    int due = PyObject_RichCompareBool(step, self->overhead_first, Py_EQ);
    if (due == 0) {
        PyObject *rest = PyNumber_Remainder(step, self->overhead_every);
        if (rest == NULL) goto finally;
        due = PyObject_RichCompareBool(rest, ZERO, Py_EQ);
        Py_DECREF(rest);
    }
    if (due < 0) goto finally;
    if (due) {
        PyObject *done = call_method(agent, NAME[F__overhead_fact], &step, 1);
        if (done == NULL) goto finally;
        Py_DECREF(done);
    }
    result = 1;
finally:
    Py_XDECREF(model);
    Py_XDECREF(flops);
    Py_XDECREF(micro_batches);
    Py_XDECREF(tokens);
    Py_XDECREF(tokens_source);
    Py_XDECREF(loss);
    Py_XDECREF(outbox);
    Py_XDECREF(loss_value);
    Py_XDECREF(loss_t);
    Py_XDECREF(dp);
    Py_XDECREF(item);
    return result;
}

/* mark[i]() for the detector's (weakref to the optimizer, weakref to its first gradient, version) marks. */
static PyObject *mark_ref(PyObject *mark, Py_ssize_t i) {
    PyObject *ref = PySequence_GetItem(mark, i);
    if (ref == NULL) return NULL;
    PyObject *target = PyObject_CallNoArgs(ref);
    Py_DECREF(ref);
    return target;
}

/* The steady lane of pre_hook, inside its try: 1 when it handled the step, 0 when the general way must, -1 on
   failure. */
static int steady_lane(Hook *self, PyObject *optimizer, PyObject *key, double started) {
    PyObject *det = self->probe;
    int result = -1;
    PyObject *groups = NULL, *group = NULL, *params = NULL, *grad = NULL, *marks = NULL, *mark = NULL;
    PyObject *target = NULL, *version = NULL, *grad_target = NULL, *previous_start_t = NULL, *previous_calls = NULL;
    PyObject *agent_s = NULL, *now_f = NULL, *step = NULL, *step_time_s = NULL, *agent_us = NULL;
    PyObject *previous_agent_s = NULL;
    if ((groups = PyObject_GetAttr(optimizer, NAME[F_param_groups])) == NULL) goto finally;
    if ((group = PySequence_GetItem(groups, 0)) == NULL) goto finally;
    if ((params = PyObject_GetItem(group, NAME[F_params])) == NULL) goto finally;
    int any = PyObject_IsTrue(params);
    if (any < 0) goto finally;
    if (any) {
        PyObject *first = PySequence_GetItem(params, 0);
        if (first == NULL) goto finally;
        grad = PyObject_GetAttr(first, NAME[F_grad]);
        Py_DECREF(first);
        if (grad == NULL) goto finally;
    } else {
        grad = Py_NewRef(Py_None);
    }
    if ((marks = get(self, F__marks, det)) == NULL) goto finally;
    mark = PyObject_CallMethodOneArg(marks, NAME[F_get], key);
    if (mark == NULL) goto finally;
    result = 0;
    if (grad == Py_None || mark == Py_None) goto finally;
    result = -1;
    if ((target = mark_ref(mark, 0)) == NULL) goto finally;
    if (target != optimizer) {
        result = 0;
        goto finally;
    }
    if ((version = PyObject_GetAttr(grad, NAME[F__version])) == NULL) goto finally;
    if ((grad_target = mark_ref(mark, 1)) == NULL) goto finally;
    int same = grad_target == grad;
    if (same) {
        PyObject *marked = PySequence_GetItem(mark, 2);
        if (marked == NULL) goto finally;
        int unchanged = PyObject_RichCompareBool(version, marked, Py_EQ);
        Py_DECREF(marked);
        if (unchanged < 0) goto finally;
        if (unchanged) { /* stepped again without a backward: the same iteration */
            if (add(self, F__calls, det, Py_NewRef(ONE)) < 0) goto finally;
            if (add_seconds(self, F__agent_s, det, monotonic_s() - started) < 0) goto finally;
            result = 1;
            goto finally;
        }
    }
    int postless = get_true(self, F__postless, det);
    if (postless < 0) goto finally;
    if (postless) {
        /* No post-hook (_lane_postless): its mark, written here, as it would find it after the step. */
        PyObject *optimizer_ref = PySequence_GetItem(mark, 0);
        PyObject *grad_ref = optimizer_ref == NULL ? NULL
                             : same               ? PySequence_GetItem(mark, 1)
                                                  : PyWeakref_NewRef(grad, NULL);
        PyObject *new_mark = grad_ref != NULL ? PyTuple_Pack(3, optimizer_ref, grad_ref, version) : NULL;
        Py_XDECREF(optimizer_ref);
        Py_XDECREF(grad_ref);
        if (new_mark == NULL) goto finally;
        int stored = PyObject_SetItem(marks, key, new_mark);
        Py_DECREF(new_mark);
        if (stored < 0) goto finally;
    } else {
        if (set(self, F__seen_grad, det, PyLong_FromVoidPtr(grad)) < 0) goto finally;
        if (set(self, F__seen_version, det, Py_NewRef(version)) < 0) goto finally;
    }
    /* A new iteration: what _count does for an optimizer alone in the iteration that ends. */
    if ((previous_start_t = get(self, F__iteration_start_t, det)) == NULL) goto finally;
    if ((previous_calls = get(self, F__calls, det)) == NULL) goto finally;
    double now = monotonic_s();
    if ((now_f = PyFloat_FromDouble(now)) == NULL) goto finally;
    if ((agent_s = get(self, F__agent_s, det)) == NULL) goto finally;
    if (PyFloat_CheckExact(agent_s)) {
        previous_agent_s = PyFloat_FromDouble(PyFloat_AS_DOUBLE(agent_s) + (now - started));
    } else {
        PyObject *elapsed = PyFloat_FromDouble(now - started);
        previous_agent_s = elapsed != NULL ? PyNumber_Add(agent_s, elapsed) : NULL;
        Py_XDECREF(elapsed);
    }
    if (previous_agent_s == NULL) goto finally;
    if (add(self, F_counted, det, Py_NewRef(ONE)) < 0) goto finally;
    if (add(self, F_iteration, det, Py_NewRef(ONE)) < 0) goto finally;
    if (set(self, F__calls, det, Py_NewRef(ONE)) < 0) goto finally;
    if (set(self, F__iteration_start_t, det, Py_NewRef(now_f)) < 0) goto finally;
    if ((step = get(self, F_iteration, det)) == NULL) goto finally;
    if ((step_time_s = PyNumber_Subtract(now_f, previous_start_t)) == NULL) goto finally;
    if (PyFloat_CheckExact(previous_agent_s)) {
        agent_us = PyFloat_FromDouble(PyFloat_AS_DOUBLE(previous_agent_s) * 1e6);
    } else {
        PyObject *million = PyFloat_FromDouble(1e6);
        agent_us = million != NULL ? PyNumber_Multiply(previous_agent_s, million) : NULL;
        Py_XDECREF(million);
    }
    if (agent_us == NULL) goto finally;
    int sent = steady_step(self, step, now_f, step_time_s, previous_calls, agent_us);
    if (sent < 0) goto finally;
    if (!sent) {
        PyObject *args[6] = {now_f, previous_start_t, previous_calls, previous_agent_s, Py_None, Py_False};
        PyObject *done = call_method(det, NAME[F__send_fields], args, 6);
        if (done == NULL) goto finally;
        Py_DECREF(done);
    }
    /* What is left of this call belongs to the new iteration (as _count and pre_hook count it). */
    if (set(self, F__agent_s, det, PyFloat_FromDouble(monotonic_s() - started)) < 0) goto finally;
    result = 1;
finally:
    Py_XDECREF(groups);
    Py_XDECREF(group);
    Py_XDECREF(params);
    Py_XDECREF(grad);
    Py_XDECREF(marks);
    Py_XDECREF(mark);
    Py_XDECREF(target);
    Py_XDECREF(version);
    Py_XDECREF(grad_target);
    Py_XDECREF(previous_start_t);
    Py_XDECREF(previous_calls);
    Py_XDECREF(agent_s);
    Py_XDECREF(now_f);
    Py_XDECREF(step);
    Py_XDECREF(step_time_s);
    Py_XDECREF(agent_us);
    Py_XDECREF(previous_agent_s);
    return result;
}

/* IterationDetector.pre_hook(optimizer, args, kwargs) */
static PyObject *step_vectorcall(Hook *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 3 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "an optimizer step pre-hook takes (optimizer, args, kwargs)");
        return NULL;
    }
    PyObject *det = self->probe, *optimizer = args[0], *step_args = args[1], *step_kwargs = args[2];
    if (add(self, F_pre_calls, det, Py_NewRef(ONE)) < 0) return NULL;
    PyObject *key = PyLong_FromVoidPtr(optimizer);
    if (key == NULL) return NULL;
    PyObject *lane = get(self, F__lane, det);
    if (lane == NULL) {
        Py_DECREF(key);
        return NULL;
    }
    int steady = PyObject_RichCompareBool(key, lane, Py_EQ);
    Py_DECREF(lane);
    if (steady > 0) steady = get_true(self, F_steps_on, det);
    if (steady > 0) {
        Py_ssize_t n = PyObject_Size(step_args);
        steady = n < 0 ? -1 : n == 1;
    }
    if (steady > 0) {
        int keywords = PyObject_IsTrue(step_kwargs);
        steady = keywords < 0 ? -1 : !keywords;
    }
    if (steady < 0) {
        Py_DECREF(key);
        return NULL;
    }
    if (steady) {
        /* The steady lane: the optimizer that alone makes up each iteration, stepped without a closure. */
        double started = monotonic_s();
        int handled = steady_lane(self, optimizer, key, started);
        if (handled < 0) {
            Py_DECREF(key);
            if (stop_probe(self, S_steps) < 0) return NULL;
            Py_RETURN_NONE;
        }
        if (handled) {
            Py_DECREF(key);
            Py_RETURN_NONE;
        }
    }
    Py_DECREF(key);
    return call_method(det, NAME[F__general_pre], args, 3);
}

static PyObject *step_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *detector, *agent, *code, *attached, *origin, *first, *every;
    static char *keywords[] = {"detector", "agent", "code", "attached", "origin", "overhead_first",
                               "overhead_every", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOO:StepPreHook", keywords, &detector, &agent, &code,
                                     &attached, &origin, &first, &every))
        return NULL;
    Hook *self = hook_alloc(type, (vectorcallfunc)step_vectorcall, agent, detector);
    if (self == NULL) return NULL;
    self->code = Py_NewRef(code);
    self->attached = Py_NewRef(attached);
    self->origin = Py_NewRef(origin);
    self->overhead_first = Py_NewRef(first);
    self->overhead_every = Py_NewRef(every);
    return (PyObject *)self;
}

/* -- the types -------------------------------------------------------------------------------------------------------- */

static PyMemberDef hook_members[] = {
    {"agent", T_OBJECT, offsetof(Hook, agent), READONLY, "the agent"},
    {"probe", T_OBJECT, offsetof(Hook, probe), READONLY, "the probe whose Python function this hook transliterates"},
    {"original", T_OBJECT, offsetof(Hook, original), READONLY, "what the hook wraps (None for the step hook)"},
    {NULL},
};

static PyMemberDef forward_members[] = {
    {"agent", T_OBJECT, offsetof(Hook, agent), READONLY, "the agent"},
    {"probe", T_OBJECT, offsetof(Hook, probe), READONLY, "the model probe"},
    {"function", T_OBJECT, offsetof(Hook, original), READONLY, "the class's forward"},
    {"module_ref", T_OBJECT, offsetof(Hook, module_ref), READONLY, "a weak reference to the model"},
    {NULL},
};

static PyGetSetDef hook_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {NULL},
};

static PyGetSetDef forward_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {"__self__", (getter)forward_self, NULL, "the model"},
    {"__func__", (getter)forward_func, NULL, "the class's forward"},
    {"__wrapped__", (getter)forward_wrapped, NULL, "the class's forward bound to the model"},
    {NULL},
};

static PyMethodDef forward_methods[] = {
    {"__deepcopy__", (PyCFunction)forward_deepcopy, METH_O, "the class's forward, bound to the model's copy"},
    {"__reduce__", (PyCFunction)forward_reduce, METH_NOARGS, "the loaded model's own forward"},
    {NULL},
};

#define HOOK_TYPE(cname, pyname, flags, doc, new_, ...)                                                                   \
    static PyTypeObject cname = {                                                                                    \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = "trainmeter_agent._native." pyname,                                 \
        .tp_basicsize = sizeof(Hook),                                                                                \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | (flags),                  \
        .tp_doc = doc,                                                                                               \
        .tp_new = new_,                                                                                              \
        .tp_dealloc = (destructor)hook_dealloc,                                                                      \
        .tp_traverse = (traverseproc)hook_traverse,                                                                  \
        .tp_clear = (inquiry)hook_clear,                                                                             \
        .tp_call = hook_call,                                                                                        \
        .tp_vectorcall_offset = offsetof(Hook, vectorcall),                                                          \
        .tp_dictoffset = offsetof(Hook, dict),                                                                       \
        .tp_weaklistoffset = offsetof(Hook, weakrefs),                                                               \
        __VA_ARGS__};

HOOK_TYPE(DataNextType, "DataNext", Py_TPFLAGS_METHOD_DESCRIPTOR,
          "DataNext(original, agent, phases, code): a DataLoader iterator's __next__ that times the data wait "
          "(Phases.attach_data_wait's __next__, in C).",
          next_new, .tp_members = hook_members, .tp_getset = hook_getset, .tp_descr_get = next_descr_get)
HOOK_TYPE(ForwardType, "Forward", 0,
          "Forward(probe, module, function, agent): the model's forward while the model probe watches it "
          "(ModelForward with ModelProbe._pre_hook, in C).",
          forward_new, .tp_members = forward_members, .tp_getset = forward_getset, .tp_methods = forward_methods,
          .tp_getattro = (getattrofunc)forward_getattro)
HOOK_TYPE(BackwardType, "Backward", 0,
          "Backward(original, probe, agent, limit): torch.autograd.backward that reads the loss passed to it "
          "(_loss._wrap_backward's backward, in C).",
          backward_new, .tp_members = hook_members, .tp_getset = hook_getset)
HOOK_TYPE(StepPreHookType, "StepPreHook", 0,
          "StepPreHook(detector, agent, code, attached, origin, overhead_first, overhead_every): the global "
          "optimizer step pre-hook (IterationDetector.pre_hook's steady lane with Agent.send_steady_step, in C).",
          step_new, .tp_members = hook_members, .tp_getset = hook_getset)

/* -- the module ------------------------------------------------------------------------------------------------------- */

/* trace_as(type, function): what reading `type.__call__` gives from now on (dynamo reads it to trace a call of an
   object, and cannot trace C): `function`, the Python twin. CPython's own calls still go to the C hook (its call slot
   and vectorcall do not change). */
static PyObject *trace_as(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || (args[0] != (PyObject *)&ForwardType && args[0] != (PyObject *)&DataNextType &&
                       args[0] != (PyObject *)&BackwardType && args[0] != (PyObject *)&StepPreHookType)) {
        PyErr_SetString(PyExc_TypeError, "trace_as(hook_type, function): a type of this module and a function");
        return NULL;
    }
    if (!PyFunction_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "trace_as: the Python twin must be a Python function");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)args[0];
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *dict = PyType_GetDict(type);
#else
    PyObject *dict = Py_XNewRef(type->tp_dict);
#endif
    int stored = dict != NULL ? PyDict_SetItemString(dict, "__call__", args[1]) : -1;
    Py_XDECREF(dict);
    if (stored < 0) return NULL;
    PyType_Modified(type);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"trace_as", (PyCFunction)(void (*)(void))trace_as, METH_FASTCALL,
     "trace_as(hook_type, function): the Python function that tracers read as the type's __call__"},
    {NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_methods = module_methods,
    .m_name = "trainmeter_agent._native",
    .m_doc = "The agent's four hottest hooks in C, each a transliteration of a Python function of the agent "
             "(see the top of _native.c).",
    .m_size = -1,
};

static int intern(PyObject **target, const char *text) {
    *target = PyUnicode_InternFromString(text);
    return *target == NULL ? -1 : 0;
}

PyMODINIT_FUNC PyInit__native(void) {
#define INTERN(name)                                                                                                 \
    if (intern(&NAME[F_##name], #name) < 0) return NULL;
    NAMES(INTERN)
#undef INTERN
    if (intern(&S_data_wait, "data_wait") < 0 || intern(&S_dataloader, "dataloader") < 0 ||
        intern(&S_emit, "emit") < 0 || intern(&S_hooks, "hooks") < 0 || intern(&S_input_ids, "input_ids") < 0 ||
        intern(&S_model, "model") < 0 || intern(&S_loss, "loss") < 0 || intern(&S_steps, "steps") < 0)
        return NULL;
    ZERO = PyLong_FromLong(0);
    ONE = PyLong_FromLong(1);
    PyObject *builtins = PyImport_ImportModule("builtins");
    if (builtins == NULL) return NULL;
    builtin_sum = PyObject_GetAttrString(builtins, "sum");
    builtin_getattr = PyObject_GetAttrString(builtins, "getattr");
    Py_DECREF(builtins);
    copy_module = PyImport_ImportModule("copy");
    if (ZERO == NULL || ONE == NULL || builtin_sum == NULL || builtin_getattr == NULL || copy_module == NULL)
        return NULL;
    PyTypeObject *types[] = {&DataNextType, &ForwardType, &BackwardType, &StepPreHookType};
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL) return NULL;
    /* The CRC-32 of the source this was built from (hatch_build.py): the agent uses the module only where it matches
       the _native.c beside it. */
    PyObject *crc = PyLong_FromUnsignedLong(TM_SOURCE_CRC);
    if (crc == NULL || PyModule_AddObjectRef(module, "SOURCE_CRC", crc) < 0) {
        Py_XDECREF(crc);
        Py_DECREF(module);
        return NULL;
    }
    Py_DECREF(crc);
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (PyType_Ready(types[i]) < 0 || PyModule_AddObjectRef(module, strrchr(types[i]->tp_name, '.') + 1,
                                                                (PyObject *)types[i]) < 0) {
            Py_DECREF(module);
            return NULL;
        }
    }
    return module;
}
