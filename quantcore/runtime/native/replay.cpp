// quantcore's native launch path (see __init__.py): a kept plan's output allocations and kernel launches
// replayed in C++, and the custom ops' CUDA and AutogradCUDA kernels, which replay a kept plan without
// entering Python. Built against torch's headers only: the CUDA driver is opened at run time, so the
// same source compiles where torch has no CUDA.
#include <torch/extension.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <dlfcn.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

using CUresult = int;
using CUfunction = void*;
using CUstream = void*;
using CUcontext = void*;
constexpr CUresult kSuccess = 0;
constexpr c10::DispatchKeySet kCudaKeys(c10::DispatchKey::CUDA);
constexpr size_t kMaxParams = 128;

// The driver's entry points, looked up once in libcuda (the one torch and the backends use).
struct Driver {
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                     void**, void**) = nullptr;
  CUresult (*capturing)(CUstream, int*) = nullptr;
  CUresult (*param_info)(CUfunction, size_t, size_t*, size_t*) = nullptr;  // CUDA >= 12.4
  CUresult (*error_string)(CUresult, const char**) = nullptr;
  CUresult (*ctx_current)(CUcontext*) = nullptr;
  CUresult (*ctx_set)(CUcontext) = nullptr;
  CUresult (*device_get)(int*, int) = nullptr;
  CUresult (*primary_retain)(CUcontext*, int) = nullptr;
  std::string missing;

  Driver() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      missing = "libcuda.so.1 could not be opened";
      return;
    }
    find(lib, launch, "cuLaunchKernel");
    find(lib, capturing, "cuStreamIsCapturing");
    find(lib, error_string, "cuGetErrorString");
    find(lib, ctx_current, "cuCtxGetCurrent");
    find(lib, ctx_set, "cuCtxSetCurrent");
    find(lib, device_get, "cuDeviceGet");
    find(lib, primary_retain, "cuDevicePrimaryCtxRetain");
    param_info = reinterpret_cast<decltype(param_info)>(dlsym(lib, "cuFuncGetParamInfo"));
  }

  template <typename F>
  void find(void* lib, F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(lib, name));
    if (f == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name + " not in libcuda";
  }

  void check(CUresult r, const char* what) const {
    if (r == kSuccess) return;
    const char* text = nullptr;
    if (error_string != nullptr) error_string(r, &text);
    throw std::runtime_error(std::string("quantcore native launch: ") + what + " failed: " +
                             (text ? text : "CUDA error " + std::to_string(r)));
  }
};

Driver& driver() {
  static Driver d;
  return d;
}

// One kernel parameter: an 8-byte slot holding a constant's little-endian bits (the driver reads as many
// bytes as the parameter has), or the address of one of the call's inputs or outputs.
enum Kind : int { kConst = 0, kInput = 1, kOutput = 2 };
struct Param {
  int kind;
  uint64_t value;  // the constant, or the input's / output's index
};

struct Launch {
  CUfunction function;
  std::array<unsigned, 3> grid, block;
  unsigned smem;
  std::vector<Param> params;
};

struct Output {
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
};

// What one call does: allocate `outputs`, run `launches` in order, return `results` (output indices).
struct Variant {
  std::vector<Output> outputs;
  std::vector<Launch> launches;
  std::vector<int> results;
  bool as_tuple;
};

Variant parse_variant(const py::handle& v, size_t inputs) {
  auto t = v.cast<py::tuple>();
  Variant out;
  for (auto o : t[0].cast<py::list>()) {
    auto spec = o.cast<py::tuple>();
    PyObject* dtype = spec[2].ptr();
    if (!THPDtype_Check(dtype)) throw std::invalid_argument("an output's dtype must be a torch.dtype");
    out.outputs.push_back({spec[0].cast<std::vector<int64_t>>(), spec[1].cast<std::vector<int64_t>>(),
                           reinterpret_cast<THPDtype*>(dtype)->scalar_type});
  }
  for (auto l : t[1].cast<py::list>()) {
    auto spec = l.cast<py::tuple>();
    Launch launch{reinterpret_cast<CUfunction>(spec[0].cast<uint64_t>()), spec[1].cast<std::array<unsigned, 3>>(),
                  spec[2].cast<std::array<unsigned, 3>>(), spec[3].cast<unsigned>(), {}};
    for (auto p : spec[4].cast<py::list>()) {
      auto pair = p.cast<std::pair<int, uint64_t>>();
      Param param{pair.first, pair.second};
      if ((param.kind == kInput && param.value >= inputs) ||
          (param.kind == kOutput && param.value >= out.outputs.size()) || param.kind < kConst || param.kind > kOutput)
        throw std::invalid_argument("a kernel parameter names no input or output");
      launch.params.push_back(param);
    }
    if (launch.params.size() > kMaxParams) throw std::invalid_argument("too many kernel parameters");
    out.launches.push_back(std::move(launch));
  }
  out.results = t[2].cast<std::vector<int>>();
  for (int r : out.results)
    if (r < 0 || static_cast<size_t>(r) >= out.outputs.size()) throw std::invalid_argument("a result names no output");
  out.as_tuple = t[3].cast<bool>();
  return out;
}

// Whether each launch passes exactly as many parameters as its kernel takes, none wider than a slot
// (the driver's own account, where it gives one).
bool parameters_match(const Variant& v) {
  auto* info = driver().param_info;
  if (info == nullptr) return true;
  for (const auto& l : v.launches) {
    size_t offset = 0, size = 0;
    for (size_t i = 0; i < l.params.size(); ++i)
      if (info(l.function, i, &offset, &size) != kSuccess || size > 8) return false;
    if (info(l.function, l.params.size(), &offset, &size) == kSuccess) return false;
  }
  return true;
}

CUstream current_stream(int device) {
  static const c10::impl::DeviceGuardImplInterface* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return cuda->getStream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device))).native_handle();
}

void ensure_context(int device) {
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  d.check(d.ctx_current(&ctx), "cuCtxGetCurrent");
  if (ctx != nullptr) return;
  int dev = 0;
  d.check(d.device_get(&dev, device), "cuDeviceGet");
  d.check(d.primary_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  d.check(d.ctx_set(ctx), "cuCtxSetCurrent");
}

// A prepared run (`backends.base.prepared`) replayed natively. Until its Python `run` can be described
// (`describe()` returns the spec; None: not yet, e.g. before Triton compiled the kernel; False: never)
// every call runs `run`, as does every call while a graph is captured where the spec says so.
class Replay {
 public:
  Replay(py::object run, py::object describe, int device)
      : run_(std::move(run)), describe_(std::move(describe)), device_(device) {}

  py::object call(const py::args& args) {
    if (state_ != kReady || python_now()) return pending(args);
    std::array<uint64_t, kMaxParams> inputs{};
    size_t n = std::min(args.size(), kMaxParams);
    for (size_t i = 0; i < n; ++i) {
      PyObject* a = args[i].ptr();
      if (a == Py_None) continue;
      if (!THPVariable_Check(a)) return run_(*args);
      inputs[i] = reinterpret_cast<uint64_t>(THPVariable_Unpack(a).data_ptr());
    }
    std::vector<at::Tensor> outs = launch(inputs.data());
    if (outs.size() == 1 && !as_tuple_) return py::reinterpret_steal<py::object>(THPVariable_Wrap(outs[0]));
    py::tuple result(outs.size());
    for (size_t i = 0; i < outs.size(); ++i)
      result[i] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(outs[i])));
    return result;
  }

  // The results of one call on inputs whose addresses are `inputs` (0: an absent optional one).
  std::vector<at::Tensor> launch(const uint64_t* inputs) const {
    const Driver& d = driver();
    c10::DeviceGuard guard(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device_)));
    CUstream stream = current_stream(device_);
    const Variant* v = &*variant_;
    // What at::empty_strided does on CUDA, without its dispatch and options (act_quant's two outputs: 3.0 us
    // through it, 1.6 so, on the H100 host): the current allocator of
    // CUDA devices (torch's caching allocator, or one that replaced it), on the guard's device.
    c10::Allocator* allocator = c10::GetAllocator(c10::DeviceType::CUDA);
    std::vector<at::Tensor> outputs;
    outputs.reserve(v->outputs.size());
    for (const auto& o : v->outputs)
      outputs.emplace_back(at::detail::empty_strided_generic(o.sizes, o.strides, allocator, kCudaKeys, o.dtype));
    std::array<uint64_t, kMaxParams> slots;
    std::array<void*, kMaxParams> params;
    for (const auto& l : v->launches) {
      if (l.grid[0] == 0 || l.grid[1] == 0 || l.grid[2] == 0) continue;
      for (size_t i = 0; i < l.params.size(); ++i) {
        const Param& p = l.params[i];
        slots[i] = p.kind == kConst   ? p.value
                   : p.kind == kInput ? inputs[p.value]
                                      : reinterpret_cast<uint64_t>(outputs[p.value].data_ptr());
        params[i] = &slots[i];
      }
      CUresult r = d.launch(l.function, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], l.smem,
                            stream, params.data(), nullptr);
      if (r == 201) {  // CUDA_ERROR_INVALID_CONTEXT: a thread that has no current context yet
        ensure_context(device_);
        r = d.launch(l.function, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], l.smem, stream,
                     params.data(), nullptr);
      }
      d.check(r, "cuLaunchKernel");
    }
    std::vector<at::Tensor> results;
    results.reserve(v->results.size());
    for (int r : v->results) results.push_back(outputs[r]);
    return results;
  }

  bool ready() const { return state_ == kReady; }
  // Whether this call must run the Python run: a graph is being captured and the spec says so.
  bool python_now() const { return python_while_capturing_ && capturing(current_stream(device_)); }
  size_t inputs() const { return inputs_; }
  size_t results() const { return variant_ ? variant_->results.size() : 0; }
  py::object run() const { return run_; }

 private:
  enum State { kPending, kReady, kNever };

  py::object pending(const py::args& args) {
    py::object out = run_(*args);
    if (state_ == kPending) adopt(describe_());
    return out;
  }

  void adopt(const py::object& spec) {
    if (spec.is_none()) return;
    state_ = kNever;
    if (!driver().missing.empty() || !py::isinstance<py::tuple>(spec)) return;
    auto t = spec.cast<py::tuple>();
    inputs_ = t[0].cast<size_t>();
    if (inputs_ > kMaxParams) return;
    Variant variant = parse_variant(t[1], inputs_);
    if (!parameters_match(variant)) return;
    as_tuple_ = variant.as_tuple;
    python_while_capturing_ = t[2].cast<bool>();
    variant_ = std::move(variant);
    state_ = kReady;
  }

  static bool capturing(CUstream stream) {
    int status = 0;
    driver().check(driver().capturing(stream, &status), "cuStreamIsCapturing");
    return status != 0;
  }

  py::object run_, describe_;
  int device_;
  State state_ = kPending;
  size_t inputs_ = 0;
  bool as_tuple_ = false;
  bool python_while_capturing_ = false;  // a run that launches something else while a graph is captured
  std::optional<Variant> variant_;
};

// ---- The custom ops' kernels ----------------------------------------------------------------------

// What selection reads besides the call (`dispatch._STATE`): kept plans are replayed here only while the
// simulation and priority contexts are unset; the environment's variables are part of the key.
struct State {
  py::object simulation, priority;  // the ContextVars
  std::vector<std::string> variables;
};

State& state() {
  static State* s = new State();  // never destroyed: it holds Python objects past interpreter teardown
  return *s;
}

// Appends `v`'s type and value to `key`; false for a value kept plans are not keyed on.
bool encode(const c10::IValue& v, std::string& key) {
  auto put = [&key](const void* p, size_t n) { key.append(static_cast<const char*>(p), n); };
  auto put64 = [&put](int64_t x) { put(&x, sizeof x); };
  if (v.isNone()) {
    key.push_back('n');
  } else if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    // A negative view's memory holds its values' negation: the Python kernels resolve it, never a replay.
    if (!t.defined() || t.layout() != at::kStrided || !t.is_cuda() || t.is_neg()) return false;
    key.push_back('t');
    put64(static_cast<int64_t>(t.scalar_type()));
    put64(t.get_device());
    put64(t.dim());
    for (int64_t s : t.sizes()) put64(s);
    for (int64_t s : t.strides()) put64(s);
    put64(reinterpret_cast<uint64_t>(t.data_ptr()) & 15);
  } else if (v.isInt()) {
    key.push_back('i');
    put64(v.toInt());
  } else if (v.isDouble()) {
    key.push_back('d');
    double d = v.toDouble();
    put(&d, sizeof d);
  } else if (v.isBool()) {
    key.push_back(v.toBool() ? 'T' : 'F');
  } else if (v.isString()) {
    const auto& s = v.toStringRef();
    key.push_back('s');
    put64(static_cast<int64_t>(s.size()));
    key.append(s);
  } else if (v.isIntList()) {
    key.push_back('l');
    auto list = v.toIntList();
    put64(static_cast<int64_t>(list.size()));
    for (int64_t x : list) put64(x);
  } else {
    return false;
  }
  return true;
}

// Whether this thread's selection state is the default one, with the environment's variables appended to
// `key`; needs the GIL.
bool default_state(std::string& key) {
  State& s = state();
  for (const py::object* var : {&s.simulation, &s.priority}) {
    PyObject* value = nullptr;
    if (PyContextVar_Get(var->ptr(), Py_None, &value) < 0) {
      PyErr_Clear();
      return false;
    }
    bool unset = value == Py_None;
    Py_XDECREF(value);
    if (!unset) return false;
  }
  for (const auto& name : s.variables) {
    const char* value = std::getenv(name.c_str());
    key.push_back(value ? 'e' : 'u');
    if (value) key.append(value).push_back('\0');
  }
  return true;
}

// Whether the schema types `a` as a dtype (an int on the stack, a torch.dtype to Python).
bool is_dtype(const c10::Argument& a) {
  c10::TypePtr t = a.real_type();
  if (const auto* optional = t->castRaw<c10::OptionalType>()) t = optional->getElementType();
  return t->kind() == c10::TypeKind::ScalarTypeType;
}

// The call's `n` arguments as Python objects, in the schema's order, as a Python kernel receives them.
py::tuple python_arguments(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t n) {
  const auto& schema = op.schema().arguments();
  py::tuple out(n);
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = stack[stack.size() - n + i];
    if (v.isInt() && is_dtype(schema[i]))
      out[i] = py::reinterpret_borrow<py::object>(
          reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<at::ScalarType>(v.toInt()))));
    else
      out[i] = torch::jit::toPyObject(v);
  }
  return out;
}

// Replaces the call's `n` arguments on `stack` by `out`, the Python kernel's result, as the schema's returns.
void push_result(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t n, const py::object& out) {
  const auto& returns = op.schema().returns();
  torch::jit::drop(*stack, n);
  if (returns.size() == 1) {
    torch::jit::push(*stack, torch::jit::toIValue(out, returns[0].type()));
    return;
  }
  auto t = out.cast<py::tuple>();
  if (t.size() != returns.size()) throw std::runtime_error("quantcore native kernel: wrong number of results");
  for (size_t i = 0; i < returns.size(); ++i) torch::jit::push(*stack, torch::jit::toIValue(t[i], returns[i].type()));
}

struct Kept {
  std::shared_ptr<Replay> replay;
  size_t inputs;  // the call's leading arguments the replay takes
};

// One custom op's CUDA kernel: a call whose key has a kept replay launches it; any other call runs the
// op's Python kernel `miss`, which returns (its outputs, the replay of its plan or None).
class OpKernel : public c10::OperatorKernel {
 public:
  OpKernel(py::object miss, size_t returns) : miss_(miss.release()), returns_(returns) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    auto args = torch::jit::last(*stack, n);
    std::string key;
    bool keyed = c10::impl::TorchDispatchModeTLS::stack_len() == 0;
    for (size_t i = 0; keyed && i < n; ++i) keyed = encode(args[i], key);
    py::gil_scoped_acquire gil;
    keyed = keyed && default_state(key);
    if (keyed) {
      std::shared_ptr<Replay> replay;
      size_t inputs = 0;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        auto found = kept_.find(key);
        if (found != kept_.end()) replay = found->second.replay, inputs = found->second.inputs;
      }
      if (replay && !replay->python_now()) {
        std::array<uint64_t, kMaxParams> addresses{};
        for (size_t i = 0; i < inputs; ++i)
          if (args[i].isTensor()) addresses[i] = reinterpret_cast<uint64_t>(args[i].toTensor().data_ptr());
        std::vector<at::Tensor> outs = replay->launch(addresses.data());
        torch::jit::drop(*stack, n);
        for (auto& t : outs) torch::jit::push(*stack, std::move(t));
        return;
      }
    }
    py::tuple got = miss_(python_arguments(op, *stack, n)).cast<py::tuple>();
    push_result(op, stack, n, got[0]);
    if (keyed && py::isinstance<Replay>(got[1])) {
      auto replay = got[1].cast<std::shared_ptr<Replay>>();
      size_t inputs = got[2].cast<size_t>();
      if (replay->ready() && inputs <= n && inputs <= replay->inputs() && replay->results() == returns_) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (kept_.size() >= 4096) kept_.clear();
        kept_[key] = {replay, inputs};
      }
    }
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    kept_.clear();
  }

 private:
  // Python objects that the dispatcher may outlive (it is torn down after the interpreter): never released.
  py::handle miss_;
  size_t returns_;
  std::mutex mutex_;
  std::unordered_map<std::string, Kept>& kept_ = *new std::unordered_map<std::string, Kept>();
};

// One custom op's AutogradCUDA kernel: a call that needs autograd (grad mode on and an input requiring
// grad) runs the op's Python Autograd kernel `record`; any other goes below autograd at once.
class AutogradKernel : public c10::OperatorKernel {
 public:
  explicit AutogradKernel(py::object record) : record_(record.release()) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    bool grad = false;
    if (at::GradMode::is_enabled())
      for (const auto& v : torch::jit::last(*stack, n))
        if (v.isTensor() && v.toTensor().defined() && v.toTensor().requires_grad()) grad = true;
    if (!grad) {
      op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
      return;
    }
    py::gil_scoped_acquire gil;
    push_result(op, stack, n, record_(python_arguments(op, *stack, n)));
  }

 private:
  py::handle record_;  // never released, as OpKernel's
};

std::vector<std::unique_ptr<torch::Library>>& libraries() {
  static auto* l = new std::vector<std::unique_ptr<torch::Library>>();  // never destroyed, as the dispatcher's
  return *l;
}
std::vector<OpKernel*>& kernels() {
  static auto* k = new std::vector<OpKernel*>();
  return *k;
}

void install(const std::string& ns, const std::string& name, py::object miss, py::object record, size_t returns,
             const std::string& backend_key, const std::string& autograd_key) {
  auto cuda = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::parseDispatchKey(backend_key), __FILE__,
                                               __LINE__);
  auto kernel = std::make_unique<OpKernel>(std::move(miss), returns);
  kernels().push_back(kernel.get());
  cuda->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::move(kernel)));
  auto autograd = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::parseDispatchKey(autograd_key),
                                                   __FILE__, __LINE__);
  autograd->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutogradKernel>(std::move(record))));
  libraries().push_back(std::move(cuda));
  libraries().push_back(std::move(autograd));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Replay, std::shared_ptr<Replay>>(m, "Replay")
      .def(py::init<py::object, py::object, int>(), py::arg("run"), py::arg("describe"), py::arg("device"))
      .def("__call__", &Replay::call)
      .def_property_readonly("ready", &Replay::ready)
      .def_property_readonly("run", &Replay::run);
  m.def("driver_missing", [] { return driver().missing; });
  m.def("set_state", [](py::object simulation, py::object priority, std::vector<std::string> variables) {
    State& s = state();
    s.simulation = std::move(simulation);
    s.priority = std::move(priority);
    s.variables = std::move(variables);
  });
  // The kernels go to `backend_key` and `autograd_key` ("CUDA", "AutogradCUDA"; the tests install them for
  // the CPU, where no plan is replayed: only CUDA tensors are keyed).
  m.def("install", &install, py::arg("namespace"), py::arg("name"), py::arg("miss"), py::arg("record"),
        py::arg("returns"), py::arg("backend_key") = "CUDA", py::arg("autograd_key") = "AutogradCUDA");
  m.def("clear", [] {
    for (auto* k : kernels()) k->clear();
  });
}
