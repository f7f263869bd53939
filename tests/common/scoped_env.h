// scoped_env.h: an environment variable set for a scope, with the parameters re-read, for tests.
#pragma once

#include <cstdlib>
#include <string>

extern "C" {
#include "param.h"
}

namespace chorus_test {

// Sets (value) or unsets (nullptr) an environment variable for a scope and re-reads the
// parameters; the old value comes back at the end of the scope.
struct ScopedEnv {
    std::string name, old;
    bool had;
    ScopedEnv(const char *n, const char *v) : name(n) {
        const char *o = getenv(n);
        had = o != nullptr;
        if (had) old = o;
        if (v)
            setenv(n, v, 1);
        else
            unsetenv(n);
        chorus_param_reset();
        chorus_param_init();
    }
    ~ScopedEnv() {
        if (had)
            setenv(name.c_str(), old.c_str(), 1);
        else
            unsetenv(name.c_str());
        chorus_param_reset();
        chorus_param_init();
    }
    ScopedEnv(const ScopedEnv &) = delete;
    ScopedEnv &operator=(const ScopedEnv &) = delete;
};

} // namespace chorus_test
