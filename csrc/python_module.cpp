// The Python extension module torch_wmmae._C. Importing it loads this library, whose static initializers
// register the wmmae operators (registration.cpp); the module itself is empty. The C++ library built with
// CMake leaves this file out.
#include <Python.h>

extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module_def);
}
