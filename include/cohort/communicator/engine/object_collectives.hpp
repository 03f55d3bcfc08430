// SPDX-License-Identifier: Apache-2.0
#pragma once

// Collectives of any serializable object (Boost.Serialization), behind the front door's checks.
// A serialization that fails on one rank would leave the others inside the collective: after
// the ranks agreed, a failure ends the job.

#include <cohort/communicator/engine/checks.hpp>
#include <cohort/communicator/engine/signature.hpp>
#include <cohort/config.hpp>
#include <cohort/detail/fingerprint.hpp>
#include <cohort/detail/operation.hpp>
#include <cohort/transport/mpi.hpp>

#include <boost/core/demangle.hpp>
#include <boost/mpi/collectives.hpp>
#include <boost/mpi/communicator.hpp>

#include <string_view>
#include <typeinfo>
#include <vector>

namespace cohort {
inline namespace COHORT_ABI_NAMESPACE {
namespace engine {

// What an object collective's ranks must pass alike beyond the call: the object's type (an int
// on one rank and a float on another would be read as each other's bytes).
template <class T>
std::vector<signature_entry> object_type() {
  return {{"the object's type", boost::core::demangle(typeid(T).name())}};
}

template <class T>
T bcast_obj(const checks& c, const boost::mpi::communicator& comm, const T& obj, int root) {
  detail::operation_scope scope("bcast_obj");
  c.agree_root("bcast_obj", root, typeid(T).name());
  T value = c.rank() == root ? obj : T{};
  const auto watch = c.watch_transfer("bcast_obj", 0);
  c.fatal_on_failure("bcast_obj", [&] {
    mpi::translate("bcast_obj", comm, [&] { boost::mpi::broadcast(comm, value, root); });
  });
  return value;
}

template <class T>
std::vector<T> gather_obj(const checks& c, const boost::mpi::communicator& comm, const T& obj,
                          int root) {
  detail::operation_scope scope("gather_obj");
  c.agree_root("gather_obj", root, typeid(T).name());
  std::vector<T> all;
  const auto watch = c.watch_transfer("gather_obj", 0);
  c.fatal_on_failure("gather_obj", [&] {
    mpi::translate("gather_obj", comm, [&] { boost::mpi::gather(comm, obj, all, root); });
  });
  return all;
}

template <class T>
std::vector<T> allgather_obj(const checks& c, const boost::mpi::communicator& comm, const T& obj) {
  detail::operation_scope scope("allgather_obj");
  c.settle(
      "allgather_obj",
      detail::fingerprint{}.add("allgather_obj").add(std::string_view(typeid(T).name())).value(),
      object_type<T>, {});
  const auto watch = c.watch_transfer("allgather_obj", 0);
  std::vector<T> all;
  c.fatal_on_failure("allgather_obj", [&] {
    mpi::translate("allgather_obj", comm, [&] { boost::mpi::all_gather(comm, obj, all); });
  });
  return all;
}

template <class T, class Op>
T allreduce_obj(const checks& c, const boost::mpi::communicator& comm, const T& obj, Op op) {
  detail::operation_scope scope("allreduce_obj");
  c.settle("allreduce_obj",
           detail::fingerprint{}
               .add("allreduce_obj")
               .add(std::string_view(typeid(T).name()))
               .add(std::string_view(typeid(Op).name()))
               .value(),
           [] {
             auto entries = object_type<T>();
             entries.push_back({"the operation's type", boost::core::demangle(typeid(Op).name())});
             return entries;
           },
           {});
  const auto watch = c.watch_transfer("allreduce_obj", 0);
  T result{};
  c.fatal_on_failure("allreduce_obj", [&] {
    mpi::translate("allreduce_obj", comm, [&] { boost::mpi::all_reduce(comm, obj, result, op); });
  });
  return result;
}

template <class T>
void send_obj(const checks& c, const boost::mpi::communicator& comm, const T& obj, int dest,
              int tag) {
  detail::operation_scope scope("send_obj");
  c.check_peer(dest, "send_obj");
  const auto watch = c.watch_point_to_point("send_obj", 0);
  mpi::translate("send_obj", comm, [&] { comm.send(dest, tag, obj); });
}

template <class T>
T recv_obj(const checks& c, const boost::mpi::communicator& comm, int source, int tag) {
  detail::operation_scope scope("recv_obj");
  c.check_peer(source, "recv_obj");
  T obj{};
  const auto watch = c.watch_point_to_point("recv_obj", 0);
  mpi::translate("recv_obj", comm, [&] { comm.recv(source, tag, obj); });
  return obj;
}

} // namespace engine
} // namespace COHORT_ABI_NAMESPACE
} // namespace cohort
