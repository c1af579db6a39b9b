#include "operator/kube/client.h"

#include <string>

namespace distrain::kube {

std::string ApiResponse::message() const {
  if (body.is_object()) {
    auto it = body.find("message");
    if (it != body.end() && it->is_string() && !it->get<std::string>().empty()) {
      return it->get<std::string>();
    }
  }
  if (body.is_string() && !body.get<std::string>().empty()) return body.get<std::string>();
  return "HTTP " + std::to_string(status_code);
}

}  // namespace distrain::kube
