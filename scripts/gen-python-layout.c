/* Prints the row of kLayouts (lib/stacks/python_frames.cpp) for the CPython whose headers it is
 * compiled against: offsetof() and sizeof() of the fields the frame walker reads. Built and run
 * by scripts/gen-python-layout.sh; the output is pasted into the table as it is.
 *
 * A new CPython whose fields keep their 3.13 names needs no change here; one that renames or
 * moves a field gets its own #elif branch, named after the headers it reads. */
#define Py_BUILD_CORE 1 /* the internal headers (_PyInterpreterFrame) refuse to compile without it */
#include <Python.h>

#include <stddef.h>
#include <stdio.h>

#if PY_MAJOR_VERSION != 3 || PY_MINOR_VERSION < 9
#error "the frame walker reads CPython 3.9 and later only"
#endif

#if PY_MINOR_VERSION <= 10
#include <frameobject.h> /* PyFrameObject: Include/cpython/frameobject.h */
#else
#include <internal/pycore_frame.h> /* _PyInterpreterFrame */
#endif

/* Offsets as ints; -1 where the version has no such field. */
#define OFFSET(type, field) ((int)offsetof(type, field))

int main(void) {
  int tstate_frame, cframe_current_frame = -1, frame_back, frame_code, frame_instr;
  int lasti_unit = 0, frame_owner = -1, owner_cstack = -1, code_adaptive = -1;
  const char* frame_is_object = "false";
#if PY_MINOR_VERSION <= 10
  /* Include/cpython/pystate.h, Include/cpython/frameobject.h: frames are objects. */
  tstate_frame = OFFSET(PyThreadState, frame);
  frame_is_object = "true";
  frame_back = OFFSET(PyFrameObject, f_back);
  frame_code = OFFSET(PyFrameObject, f_code);
  frame_instr = OFFSET(PyFrameObject, f_lasti);
#if PY_MINOR_VERSION == 9
  lasti_unit = 1; /* f_lasti counts bytes */
#else
  lasti_unit = (int)sizeof(_Py_CODEUNIT); /* f_lasti counts code units */
#endif
#elif PY_MINOR_VERSION <= 12
  /* Include/cpython/pystate.h (_PyCFrame), Include/internal/pycore_frame.h. */
  tstate_frame = OFFSET(PyThreadState, cframe);
  cframe_current_frame = OFFSET(_PyCFrame, current_frame);
  frame_back = OFFSET(_PyInterpreterFrame, previous);
  frame_code = OFFSET(_PyInterpreterFrame, f_code);
  frame_instr = OFFSET(_PyInterpreterFrame, prev_instr);
  frame_owner = OFFSET(_PyInterpreterFrame, owner);
#if PY_MINOR_VERSION == 12
  owner_cstack = FRAME_OWNED_BY_CSTACK; /* shim frames the walk skips */
#endif
  code_adaptive = OFFSET(PyCodeObject, co_code_adaptive);
#else
  /* 3.13: Include/cpython/pystate.h (no _PyCFrame), Include/internal/pycore_frame.h. */
  tstate_frame = OFFSET(PyThreadState, current_frame);
  frame_back = OFFSET(_PyInterpreterFrame, previous);
  frame_code = OFFSET(_PyInterpreterFrame, f_executable);
  frame_instr = OFFSET(_PyInterpreterFrame, instr_ptr);
  frame_owner = OFFSET(_PyInterpreterFrame, owner);
  owner_cstack = FRAME_OWNED_BY_CSTACK;
  code_adaptive = OFFSET(PyCodeObject, co_code_adaptive);
#endif
  /* The row, in the table's format: the field names of struct FrameLayout, in its order. */
  printf("    {.minor = %d, .tstate_frame = %d, .cframe_current_frame = %d,\n", PY_MINOR_VERSION, tstate_frame,
         cframe_current_frame);
  printf("     .frame_is_object = %s, .frame_back = %d, .frame_code = %d, .frame_instr = %d, .lasti_unit = %d,\n",
         frame_is_object, frame_back, frame_code, frame_instr, lasti_unit);
  printf("     .frame_owner = %d, .owner_cstack = %d, .code_adaptive = %d,\n", frame_owner, owner_cstack,
         code_adaptive);
  printf("     .tstate_thread_id = %d, .code_filename = %d, .code_name = %d, .ascii_data = %d},\n",
         OFFSET(PyThreadState, thread_id), OFFSET(PyCodeObject, co_filename), OFFSET(PyCodeObject, co_name),
         (int)sizeof(PyASCIIObject));
  return 0;
}
