#include "worker/tensor/cuda/shared_library.h"

#include <dlfcn.h>
#include <link.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace distrain {

absl::StatusOr<std::unique_ptr<SharedLibrary>> SharedLibrary::Open(
    const std::vector<std::string>& candidates) {
  std::vector<std::string> failures;
  for (const std::string& candidate : candidates) {
    void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      failures.push_back(why != nullptr ? why : absl::StrCat(candidate, ": not loadable"));
      continue;
    }
    std::string path = candidate;
    link_map* map = nullptr;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
        map->l_name[0] != '\0') {
      path = map->l_name;
    }
    return std::unique_ptr<SharedLibrary>(new SharedLibrary(handle, std::move(path)));
  }
  return absl::NotFoundError(absl::StrCat("cannot load any of ", absl::StrJoin(candidates, ", "),
                                          " (", absl::StrJoin(failures, "; "), ")"));
}

SharedLibrary::~SharedLibrary() { dlclose(handle_); }

absl::StatusOr<void*> SharedLibrary::Symbol(const std::string& name) const {
  dlerror();  // clear: a symbol's value may legitimately be null
  void* address = dlsym(handle_, name.c_str());
  if (const char* why = dlerror(); why != nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, " has no symbol ", name,
                                            ": a different version than this build expects (",
                                            why, ")"));
  }
  return address;
}

}  // namespace distrain
