#include "parallel/comm_ops.h"

#include "engine/autograd.h"
#include "engine/dispatch.h"

namespace remat {

Tensor all_to_all(const std::shared_ptr<ProcessGroup>& group, const Tensor& x,
                  const std::vector<std::int64_t>& send_rows, std::vector<std::int64_t>& recv_rows,
                  const std::vector<std::int64_t>* known_recv_rows) {
  return dispatch1("all_to_all", {x}, [&] {
    Tensor out;
    {
      NoGradGuard ng;
      out = group->all_to_all(x.detach().contiguous(), send_rows, recv_rows, known_recv_rows);
    }
    if (auto node = autograd::make_node("all_to_all", {&x})) {
      // The gradient goes back the way the rows came: both counts are known.
      node->backward_fn = [group, send = send_rows, recv = recv_rows](Node&, std::vector<Tensor>& g) {
        std::vector<std::int64_t> back;
        return std::vector<Tensor>{group->all_to_all(g[0].contiguous(), recv, back, &send)};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Tensor all_reduce_sum(const std::shared_ptr<ProcessGroup>& group, const Tensor& x) {
  return dispatch1("all_reduce", {x}, [&] {
    Tensor out = x.detach().contiguous().clone();
    group->all_reduce(out, ReduceOp::sum);
    if (auto node = autograd::make_node("all_reduce", {&x})) {
      node->backward_fn = [group](Node&, std::vector<Tensor>& g) {
        Tensor s = g[0].contiguous().clone();
        group->all_reduce(s, ReduceOp::sum);
        return std::vector<Tensor>{s};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Tensor all_gather(const std::shared_ptr<ProcessGroup>& group, const Tensor& x) {
  return dispatch1("all_gather", {x}, [&] {
    Tensor out;
    {
      NoGradGuard ng;
      out = group->all_gather(x.detach().contiguous());
    }
    if (auto node = autograd::make_node("all_gather", {&x})) {
      node->backward_fn = [group](Node&, std::vector<Tensor>& g) {
        return std::vector<Tensor>{group->reduce_scatter(g[0].contiguous(), ReduceOp::sum)};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

Tensor reduce_scatter(const std::shared_ptr<ProcessGroup>& group, const Tensor& x) {
  return dispatch1("reduce_scatter", {x}, [&] {
    Tensor out;
    {
      NoGradGuard ng;
      out = group->reduce_scatter(x.detach().contiguous(), ReduceOp::sum);
    }
    if (auto node = autograd::make_node("reduce_scatter", {&x})) {
      node->backward_fn = [group](Node&, std::vector<Tensor>& g) {
        return std::vector<Tensor>{group->all_gather(g[0].contiguous())};
      };
      autograd::set_history(out, node);
    }
    return out;
  });
}

}  // namespace remat
